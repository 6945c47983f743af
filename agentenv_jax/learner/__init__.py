"""The learner's side: its loops (on-policy, replay, JAX-resident envs), the models and updates
they train, the session that checkpoints and resumes them, central inference and the device
count each learner process puts in its mesh."""
