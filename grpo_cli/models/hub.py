"""The Hugging Face hub from this process's side: whether it can be reached (asked once, in seconds),
whether a model id can be had (reachable, or cached, when the process goes offline), and going
offline. models/loading.py and data/tasks.py ask before loading a hub id; run/publish.py before pushing."""

from __future__ import annotations

from grpo_cli.errors import GrpoError


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (one TCP connection, `timeout` seconds), or None.
    Asked once per process: without it an offline machine retries each download for about a minute."""
    global _HUB_STATE
    if _HUB_STATE is None:
        import socket
        from urllib.parse import urlparse

        from huggingface_hub import constants

        url = urlparse(constants.ENDPOINT)
        try:
            socket.create_connection(
                (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout
            ).close()
            _HUB_STATE = ""
        except OSError as e:
            _HUB_STATE = f"{url.hostname}: {e.strerror or type(e).__name__}"
    return _HUB_STATE or None


_HUB_STATE: str | None = None


def go_offline() -> None:
    """Read only local caches from now on (huggingface_hub, and datasets when loaded), in this process."""
    import os
    import sys

    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True


def check_hub(repo_id: str, key: str) -> None:
    """A hub model id that can be had: the hub answers, or the id is in the local cache (then the process
    goes offline, so nothing waits on the network). Else one sentence, in seconds, naming the fixes."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    if constants.HF_HUB_OFFLINE:
        if not cached:
            raise GrpoError(
                f"{key}={repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids "
                "downloading it; download it once with the network on, or point to a local directory."
            )
        return
    why = hub_unreachable()
    if why is None:
        return
    if cached:
        go_offline()
        return
    raise GrpoError(
        f"{key}={repo_id} is a hub id but the Hugging Face hub cannot be reached ({why}); connect to the "
        "network, or point to a local directory (set HF_HUB_OFFLINE=1 to work offline from the cache "
        "on purpose)."
    )
