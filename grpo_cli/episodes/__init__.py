"""Multi-turn episodes: the driver, tools and environments, tool-call formats, environment workers.

A single-turn run imports none of it: the functions here load the rest only when the env group is on.
"""


def environment(cfg, schemas: bool = True):
    """The env group's tools and environment (environments.EnvSpec), or None when single-turn."""
    if getattr(cfg, "agent", None) or getattr(cfg, "verifiers", None):
        from grpo_cli.episodes.agent import AgentSpec

        return AgentSpec(cfg)
    if getattr(cfg, "openenv", None):  # an OpenEnv server: each episode a session of it
        import functools

        from grpo_cli.config.declare import amended
        from grpo_cli.episodes.environments import EnvSpec
        from grpo_cli.episodes.openenv import OpenEnv, client_class

        client_class()
        spec = EnvSpec(amended(cfg, factory="grpo_cli.episodes.openenv:OpenEnv"), cfg.fn_dir, schemas)
        spec.factory = functools.partial(OpenEnv, cfg.openenv, cfg.openenv_action)
        return spec
    if not (cfg.tools or cfg.factory):
        return None
    from grpo_cli.episodes.environments import environment as load

    return load(cfg, schemas)


def with_env(generator, env, tokenizer, **kwargs):
    """`generator` driven turn by turn through `env` (driver.EpisodeGenerator), or as it is without one."""
    if env is None:
        return generator
    if env.kind == "agent":  # the user's agent code, served through the run's endpoint
        from grpo_cli.episodes.agent import with_agent

        return with_agent(generator, env, tokenizer, **kwargs)
    from grpo_cli.episodes.driver import with_env as drive

    return drive(generator, env, tokenizer, **kwargs)


def generator_for(generator_cfg, data, tokenizer, env, **kwargs):
    """The command's generator (the generator group; the data group's chat template and system prompt; `kwargs`:
    make_generator's precision, device, world_size, seed) for `tokenizer`, driven through `env` when there is one."""
    from grpo_cli.generate.base import make_generator

    generator = make_generator(generator_cfg, tokenizer, chat_template=data.chat_template, **kwargs)
    return with_env(generator, env, tokenizer, chat_template=data.chat_template, system_prompt=data.system_prompt)


def env_notes(env_cfg, data, env, model, tokenizer, prompts: list[str]) -> list[str]:
    """The warnings worth giving before training with `env` (notes.py); none without one."""
    if env is None:
        return []
    from grpo_cli.episodes.notes import env_notes as notes

    return notes(env_cfg, data, env, model, tokenizer, prompts)
