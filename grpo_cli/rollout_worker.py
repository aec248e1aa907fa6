"""Generation in a process of its own, overlapped with training (`trainer.max_staleness`, `generator.*`;
docs/math.md, "Stale sampling").

The worker is a fresh interpreter (`python -m grpo_cli.rollout_worker FD`) with its own model copy,
device (`generator.device`) and threads (`generator.threads`). It is fed prompts over a socket and
answers with rollouts: token ids, masks, and the log-probabilities of the weights that sampled them.
After each update the trainer pushes the policy's trainable parameters (the whole model, or a LoRA
adapter) with one broadcast per tensor over a two-process gloo group of its own, so it does not touch
a torchrun job's group; every push carries a version, the number of updates applied, and every
rollout is tagged with the version that sampled it.

The schedule (source.WorkerSource): step t trains on rollouts sampled by the weights of update
max(t - 1 - max_staleness, 0), so while the trainer updates on step t's rollouts the worker already
samples step t + max_staleness's. max_staleness=0 with `generator.worker=true` runs the same process
split one phase after the other. A rollout older than the policy carries its sampler's log-probs
(`Rollout.behaviour_logp`): the decoder's own in fp32 with the built-in decoder, else recomputed by
the worker in the training precision; they are the denominator of every ratio.

What cannot go wrong silently: a worker that dies or does not answer within `generator.timeout_s` is
a `WorkerDied` (the loop saves a checkpoint and stops with one sentence); rollouts received but not
yet trained on are written with each checkpoint, so a resumed run trains on the same rollouts an
uninterrupted one would. The worker dies with the trainer (PR_SET_PDEATHSIG) and leaves SIGINT and
SIGTERM to it: the trainer finishes its step, saves, then closes the worker.
"""

from __future__ import annotations

import datetime
import pickle
import socket
import subprocess
import sys
import traceback
from collections import deque
from dataclasses import replace
from multiprocessing.connection import Connection, wait

import torch

from grpo_cli.errors import GrpoError, SourceLost
from grpo_cli.generators import GENERATORS
from grpo_cli.rollout import ROW_FIELDS, Rollout
from grpo_cli.subprocesses import as_helper, how_it_ended

START_TIMEOUT_S = 900.0  # the worker imports torch and loads a model copy before its first answer
ROLLOUT_FIELDS = ("prompts", "group_size", "completions", "pad_token_id", "version", *(f.name for f in ROW_FIELDS))


class WorkerDied(SourceLost):
    """The generation worker is gone or stuck; the sentence says which and why."""


def rollout_state(roll: Rollout) -> dict:
    """A rollout as plain types and CPU tensors (for a socket or a checkpoint's torch.load(weights_only))."""
    out = {}
    for name in ROLLOUT_FIELDS:
        value = getattr(roll, name)
        out[name] = value.cpu() if isinstance(value, torch.Tensor) else value
    return out


def rollout_from_state(state: dict, device) -> Rollout:
    return Rollout(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in state.items()})


def pushed_tensors(model) -> list[torch.Tensor]:
    """What a push sends, in order: the trainable parameters (a whole model, or a LoRA adapter), whole
    (an FSDP2 shard is gathered: every rank pushes at the same point) and on the host."""
    out = []
    for p in model.parameters():
        if p.requires_grad:
            t = p.detach()
            t = t.full_tensor() if hasattr(t, "full_tensor") else t
            out.append(t.to("cpu").contiguous())
    return out


def _gloo(store, rank: int, timeout_s: float):
    import torch.distributed as tdist

    return tdist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=timeout_s))


def _broadcast(group, tensor: torch.Tensor) -> None:
    import torch.distributed as tdist

    opts = tdist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


class RolloutWorker:
    """The trainer's end: a Generator (generators.py) whose rollouts were requested ahead (`request`) and
    are sampled in the worker process; `push` sends it the policy's weights."""

    needs_weights = False  # the source pushes (WorkerSource.update), with a version, after each update
    takes_columns = True

    def __init__(self, cfg, tokenizer, device: torch.device, *, threads: int, max_tokens: int, rank: int = 0):
        import torch.distributed as tdist

        where = worker_device(cfg, device, rank)
        try:  # the generator's factory, by reference: one registered in this process (register_generator) too
            factory = pickle.dumps(GENERATORS[cfg.generator.name])
        except Exception as e:  # a lambda or a local class: the worker cannot import it
            raise GrpoError(f"generator.name={cfg.generator.name} is registered with a factory the generation worker "
                            f"cannot import ({type(e).__name__}: {e}); register a module-level class or function, or "
                            "a 'module:attribute' string, or set trainer.max_staleness=0 and generator.worker=false.") from None
        self.device, self.timeout_s = device, cfg.generator.timeout_s
        self.store = tdist.TCPStore("127.0.0.1", 0, 2, True, datetime.timedelta(seconds=START_TIMEOUT_S),
                                    wait_for_workers=False)
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", "grpo_cli.rollout_worker", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()  # the worker holds the only other end: its death is this end's EOF
        self.conn = Connection(ours.detach())
        self._send(("start", list(sys.path), cfg, tokenizer, str(where), threads, max_tokens, self.store.port, factory))
        self.group, self.ready, self.returns_logprobs = None, None, False
        self.requested: deque[int] = deque()  # steps asked for and not yet answered, in order
        self.received: dict[int, Rollout] = {}  # step -> rollout, not yet trained on
        self.version = None  # of the weights the worker holds (the last push)

    # --- the pipe ---

    def _send(self, message) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(message))
        except OSError:
            raise WorkerDied(f"the generation worker {how_it_ended(self.process)}") from None

    def _take(self, doing: str, timeout: float | None = None) -> None:
        """Read one answer (a ready note or a rollout) within the deadline."""
        timeout = self.timeout_s if timeout is None else timeout
        if not wait([self.conn], timeout=timeout):
            self.process.kill()
            raise WorkerDied(f"the generation worker did not answer within {timeout:g} s while {doing} "
                             "(generator.timeout_s)")
        try:
            kind, *body = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise WorkerDied(f"the generation worker {how_it_ended(self.process)} while {doing}") from None
        if kind == "ready":
            self.ready, self.returns_logprobs = body
        elif kind == "rollout":
            step, state = body
            if step != self.requested[0]:
                raise RuntimeError(f"the generation worker answered step {step}, expected {self.requested[0]}")
            self.requested.popleft()
            self.received[step] = rollout_from_state(state, self.device)
        elif kind == "error":
            raise GrpoError(body[0])
        else:
            raise RuntimeError(f"the generation worker failed:\n{body[0]}")

    # --- the schedule's calls ---

    def push(self, model, version: int) -> None:
        """Send the model's trainable weights as `version`, once the worker has answered every request
        (it reads messages in order, so it then waits for this one; its answers cannot fill the pipe
        while the broadcast blocks)."""
        while self.ready is None:
            self._take("loading its model", START_TIMEOUT_S)
        while self.requested:
            self._take(f"sampling step {self.requested[0]}")
        tensors = pushed_tensors(model)
        if [(tuple(t.shape), t.dtype) for t in tensors] != self.ready:
            raise RuntimeError("the generation worker's trainable parameters differ from the trainer's: "
                               f"{len(self.ready)} against {len(tensors)}")
        self._send(("weights", version))
        try:
            if self.group is None:
                self.group = _gloo(self.store, 0, self.timeout_s)
            for t in tensors:
                _broadcast(self.group, t)
        except RuntimeError as e:
            hung = self.process.poll() is None
            if hung and "timed out" not in str(e).lower():
                raise
            self.process.kill()
            why = (f"did not answer within {self.timeout_s:g} s" if hung else how_it_ended(self.process))
            raise WorkerDied(f"the generation worker {why} while taking the weights of update {version}"
                             + (" (generator.timeout_s)" if hung else "")) from None
        self.version = version

    def request(self, step: int, batch, group_size: int, sampling, with_logprobs: bool) -> None:
        """Ask for step `step`'s rollouts, sampled by the weights last pushed; the sampler's log-probs come
        back with them when those weights will be older than the policy that trains on them."""
        stale = step - 1 - self.version > 0
        self._send(("generate", step, batch.prompts, group_size, sampling, batch.seeds, batch.columns,
                    with_logprobs, stale))
        self.requested.append(step)

    # --- the Generator protocol ---

    def generate(self, model, prompts: list[str], group_size: int, sampling, seeds=None, *, with_logprobs=False,
                 columns=None) -> Rollout:
        """The oldest requested step's rollouts (`model` is not used: the worker samples with its copy)."""
        while not self.received:
            self._take(f"sampling step {self.requested[0] if self.requested else '?'}")
        step = min(self.received)
        roll = self.received.pop(step)
        if roll.prompts != list(prompts):
            raise RuntimeError(f"the generation worker's step {step} holds other prompts than the step trains on")
        return roll

    def update(self, model) -> None:
        """Unused: pushes carry a version (`push`)."""

    def sleep(self) -> None:
        """Nothing to free here: the worker's memory is its own."""

    def state(self) -> dict:
        """The rollouts received and not yet trained on, by step (for a checkpoint)."""
        return {step: rollout_state(roll) for step, roll in self.received.items()}

    def restore(self, state: dict) -> None:
        self.received = {int(step): rollout_from_state(s, self.device) for step, s in state.items()}

    def close(self) -> None:
        """End the worker: its pipe closes, it exits; one that does not is killed."""
        if self.process.poll() is None:
            self.conn.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.group is not None:
            self.group.abort()  # the peer is gone: without this, gloo's teardown at exit aborts the process
            self.group = None


def worker_device(cfg, trainer_device: torch.device, rank: int) -> torch.device:
    """generator.device: null = the trainer's; a CUDA device cuda:N gives local rank r's worker cuda:N+r (under
    torchrun, `generator.device=cuda:2` on 2 ranks puts the workers on GPUs 2 and 3)."""
    from grpo_cli.models import resolve_device

    if not cfg.generator.device:
        return trainer_device
    device = resolve_device(str(cfg.generator.device), key="generator.device")
    if device.type != "cuda" or not rank:
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise GrpoError(f"generator.device={cfg.generator.device} puts local rank {rank}'s worker on cuda:{index}, which "
                        f"this machine does not have ({torch.cuda.device_count()} GPUs); choose a lower first device.")
    return torch.device("cuda", index)


# --- the worker's end ---


def _serve(conn: Connection) -> None:
    """Build the generator and the model copy from the trainer's config, say ready (with what a push
    sends), then answer messages in order: ("weights", version) takes a push; ("generate", ...) samples
    with the weights held and answers ("rollout", step, state)."""
    import torch.distributed as tdist

    from grpo_cli.generators import generate, make_generator, register_generator
    from grpo_cli.models import resolve_device
    from grpo_cli.policies import load_policy
    from grpo_cli.precision import training_precision
    from grpo_cli.runtime import prepare_process
    from grpo_cli.step import StepSettings, score

    as_helper()
    import transformers

    transformers.utils.logging.disable_progress_bar()  # the trainer's console shows what the run does
    _, path, cfg, tokenizer, device, threads, max_tokens, port, factory = pickle.loads(conn.recv_bytes())
    sys.path[:] = path
    register_generator(cfg.generator.name, pickle.loads(factory))  # found on the trainer's sys.path
    device = resolve_device(device, key="generator.device")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg.model.device = str(device)  # the model copy lives on the worker's device, not the trainer's
    prepare_process(threads, device)
    precision, _ = training_precision(cfg.trainer.precision, device)
    model = load_policy(cfg, precision)
    trainable = [p for p in model.parameters() if p.requires_grad]  # what the trainer trains, in its order
    model.requires_grad_(False)
    generator = make_generator(cfg.generator, tokenizer, chat_template=cfg.data.chat_template, precision=precision,
                               device=device, seed=cfg.trainer.seed, system_prompt=cfg.data.system_prompt)
    settings = replace(StepSettings.of(cfg), max_tokens=max_tokens)
    # The decoder's own log-probs are the sampler's exactly (up to rounding) only for the built-in decoder in
    # float32; otherwise the worker recomputes them as the trainer would, in the training precision.
    own = not generator.returns_logprobs and precision.name == "fp32"
    conn.send_bytes(pickle.dumps(("ready", [(tuple(p.shape), p.dtype) for p in trainable], generator.returns_logprobs)))
    store = tdist.TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=START_TIMEOUT_S))
    group, version = None, None
    try:
        while True:
            try:
                kind, *body = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return
            if kind == "weights":
                group = group or _gloo(store, 1, cfg.generator.timeout_s)
                for p in trainable:
                    buf = p.data if p.device.type == "cpu" and p.data.is_contiguous() else torch.empty(
                        p.shape, dtype=p.dtype)
                    _broadcast(group, buf)
                    if buf is not p.data:
                        p.data.copy_(buf)
                if generator.needs_weights:
                    generator.update(model)
                version = body[0]
                continue
            step, prompts, group_size, sampling, seeds, columns, with_logprobs, stale = body
            with torch.no_grad():
                roll = generate(generator, model, prompts, group_size, sampling, seeds, columns=columns,
                                with_logprobs=with_logprobs or (stale and own))
                if stale:
                    roll.behaviour_logp = (roll.sampler_logp if own else
                                           score(model, roll, sampling.temperature, settings, precision))
                    if own and not with_logprobs:
                        roll.sampler_logp = None
            roll.version = version
            conn.send_bytes(pickle.dumps(("rollout", step, rollout_state(roll))))
    finally:
        if group is not None:
            group.abort()


if __name__ == "__main__":
    connection = Connection(int(sys.argv[1]))
    try:
        _serve(connection)
    except (BrokenPipeError, ConnectionResetError, EOFError):  # the trainer ended: no one to answer
        sys.exit(0)
    except GrpoError as e:
        connection.send_bytes(pickle.dumps(("error", str(e))))
    except BaseException:  # noqa: BLE001 - sent to the trainer with its trace
        connection.send_bytes(pickle.dumps(("bug", traceback.format_exc())))
        raise
