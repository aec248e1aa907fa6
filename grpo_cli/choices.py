"""The allowed values of every enumerated option, in one place that imports nothing heavy, so the
config is checked before torch or transformers load (config.py) and the code that acts on a value
(objective.py, precision.py, ...) uses the same tuples."""

ADVANTAGE_SCALES = ("group", "batch", "none")
STD_KINDS = ("population", "sample")
KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "sequence", "sequence_mean")
BEHAVIOURS = ("current", "frozen", "lagged")
PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16")  # training: see precision.py (auto picks one of the others)
GENERATOR_WEIGHTS = ("full", "bf16")  # generator.weights: the training rollouts' sampling weights (generator=hf)
GENERATOR_MATMULS = ("auto", "packed", "plain")  # generator.matmul: the decode's linear layers on a CPU (models/packed.py)
GENERATOR_DECODES = ("auto", "static", "direct", "eager")  # generator.decode: the one-token steps (rollout/generation.py)
INFERENCE_PRECISIONS = ("fp32", "bf16", "fp16")  # evaluate and sample: the weights' dtype
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # Llama / Qwen names
LORA_QUANTIZE = ("4bit",)  # QLoRA
RECOMPUTE_POINTWISE = ("auto", "true", "false")  # model.recompute_pointwise (models/recompute.py)
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}  # data=files, by suffix
DATA_SOURCES = ("arithmetic", "long_addition", "links", "code", "files", "hub", "none")
ANSWER_EXTRACTS = ("hash", "boxed", "last_number")  # the reference answer inside a worked solution
REWARD_EXTRACTS = ("last_number", "hash", "boxed", "regex", "full")
CORRECT_RULES = ("reward", "answer")  # what accuracy counts as right (rewards.Judge)
ENV_SANDBOXES = ("none", "os")  # env.sandbox: environment workers as they are, or confined by the kernel
SANDBOXES = ("os", "process")  # reward.sandbox: the kernel's isolation, or (chosen explicitly) a process's own
# transformers' schedules that need nothing beyond warm-up and length (get_scheduler)
SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial",
              "inverse_sqrt")
STRATEGIES = ("auto", "single", "ddp", "fsdp")  # trainer.strategy
SAMPLER_CORRECTIONS = ("none", "tis")  # algo.sampler_correction: truncated importance sampling
# What `objective=` may name: numbers of the run summary a sweeper (Optuna) can optimise
OBJECTIVES = ("reward_last20", "greedy_accuracy_after", "sampled_accuracy_after", "seconds")
