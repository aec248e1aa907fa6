"""`python -m grpo_cli train ...`: the same as `grpo`, and what torchrun launches:

torchrun --nproc-per-node 4 -m grpo_cli train trainer.strategy=ddp ...
"""

from grpo_cli.cli import main

if __name__ == "__main__":
    main()
