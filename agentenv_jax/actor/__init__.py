"""The env rank's side: its loops (on-policy segments, replay partitions), the policy it acts
with (a local jitted or numpy copy, a text generator, or the learner's over central inference)
and its episodes' bookkeeping."""
