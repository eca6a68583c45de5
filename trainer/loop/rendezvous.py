"""torchrun for a multi-node job whose c10d rendezvous only this job can host.

`python -m minilmd.trainer.loop.rendezvous TORCHRUN-ARGS...` is torchrun (torch.distributed.run) with one more
rendezvous backend, `minilmd-c10d` (daemon/slurm/job.py launches it on every node of a multi-node attempt).
torch's own c10d backend hosts its TCPStore on the endpoint's node when the port is free and otherwise falls back to
a client of whatever listens there: another user who listens on the port first receives the job's rendezvous
state and answers with anything he likes (a corrupt state: every attempt fails). Here instead:
- the node the endpoint names is the store's server (`is_host`: the rdzv_conf value when given, else this node's
  Slurm name SLURMD_NODENAME, or outside Slurm its host name or address, equal to the endpoint's host) and fails
  at once, saying so, when it cannot listen on the port: it never becomes a client of another's store;
- the server writes a proof that every client reads before it writes anything: an HMAC of the rendezvous id
  keyed by the attempt's secret (RDZV_SECRET_ENV, in the job's environment only: a command line is readable by
  every user of the node), under a key named by the secret too; a client whose store gives no such proof within
  read_timeout, or another one, refuses that store;
- the rendezvous keys are named by the secret (the run id given plus an HMAC of it), and the state torch keeps
  under them (pickled, unpickled by every agent) carries an HMAC of the secret, refused unread without it: any
  client of the store can list its keys (TCPStore.list_keys) and overwrite them, so a name alone hides nothing.
The ranks meet in a second store, which rank 0's agent serves on a port the kernel picks as it binds (torch's shared
store; main() clears torch's opt-out, TORCH_DISABLE_SHARE_RDZV_TCP_STORE, whose port is picked by a bind and a
close that another user could race). Any user of the node can connect to it too: the ranks' keys there are under a
prefix named by the secret (trainer/loop/distributed.py workers_store), so none he sets in advance is read. The
values of both stores remain readable and, once listed, writable by him: an attempt he breaks fails and is
relaunched (docs/operations.md).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import sys
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousError, RendezvousStateError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import Token
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler as dynamic_handler
from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname, parse_rendezvous_endpoint

from minilmd.names import RDZV_BACKEND as BACKEND
from minilmd.names import RDZV_SECRET_ENV
from minilmd.protocol import EXIT_CONFIG

DEFAULT_READ_TIMEOUT_S = 60
SHARE_OPT_OUT_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
SEAL_BYTES = 32  # an HMAC-SHA256 before the rendezvous state's bytes


class RendezvousRefused(RendezvousConnectionError):
    """The store at the endpoint is not this job's, or this node cannot host it."""


class _Backend(C10dRendezvousBackend):
    """torch's c10d backend over the store given, by this backend's name (torch checks that they agree), its state
    sealed by the attempt's secret. torch unpickles the state it reads, and any client of the store can list its
    keys (TCPStore.list_keys) and so overwrite the state under its secret-derived name: an unsealed state would be
    another user's code run by every agent. A state without this job's seal is refused before torch sees it."""

    def __init__(self, store: TCPStore, run_id: str, secret: str) -> None:
        self._secret = secret.encode()
        super().__init__(store, run_id)

    @property
    def name(self) -> str:
        return BACKEND

    def _seal(self, state: bytes) -> bytes:
        return hmac.new(self._secret, self._key.encode() + b"\0" + state, hashlib.sha256).digest() + state

    def _open(self, sealed: bytes) -> bytes:
        seal, state = sealed[:SEAL_BYTES], sealed[SEAL_BYTES:]
        if not hmac.compare_digest(seal, self._seal(state)[:SEAL_BYTES]):
            raise RendezvousStateError(
                "the rendezvous state in the store carries no seal of this job's secret: another process wrote it "
                "(any client of the store can); refused unread, this attempt fails")
        return state

    def get_state(self) -> tuple[bytes, Token] | None:
        found = super().get_state()
        return None if found is None else (self._open(found[0]), found[1])

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        found = super().set_state(self._seal(state), token)
        return None if found is None else (self._open(found[0]), found[1], found[2])


def _digest(secret: str, what: str) -> str:
    return hmac.new(secret.encode(), what.encode(), hashlib.sha256).hexdigest()


def _secret() -> str:
    secret = os.environ.get(RDZV_SECRET_ENV, "")
    if len(secret) < 32:
        raise RendezvousRefused(f"{RDZV_SECRET_ENV} is not set (or shorter than 32 characters): the minilmd-c10d "
                                f"rendezvous needs the attempt's secret in the environment of every node")
    return secret


BACKEND_OPTIONS = ("--rdzv-backend", "--rdzv_backend")


def _names_backend(argv: list[str]) -> bool:
    """Whether torchrun's arguments choose this module's rendezvous: the value of its backend option
    (`--rdzv-backend minilmd-c10d`, `=` too; the last one given wins, as argparse reads it). Only that option's:
    another equal to the name (`--rdzv-id minilmd-c10d`) chooses nothing."""
    chosen = None
    for i, arg in enumerate(argv):
        option, eq, value = arg.partition("=")
        if option in BACKEND_OPTIONS:
            chosen = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return chosen == BACKEND


def _refuse_without_secret(argv: list[str]) -> None:
    """A secret forgotten by hand (no `export`): one line and exit 2 before torch starts the agent, whose handler
    would raise the same refusal as a traceback of 34 lines."""
    try:
        if _names_backend(argv):
            _secret()
    except RendezvousRefused as e:
        print(f"minilmd rendezvous: {e}; export the same random one on every node, e.g. `export {RDZV_SECRET_ENV}="
              f"$(openssl rand -hex 32)` (never on a command line)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


def is_host(params: RendezvousParameters, host: str) -> bool:
    """Whether this node serves the store: rdzv_conf's is_host when given; else under Slurm whether this node's
    Slurm name is the endpoint's host (the supervisor names the first node of the allocation); else torch's test
    of this machine's host names and addresses."""
    given = params.get_as_bool("is_host")
    if given is not None:
        return given
    slurm_name = os.environ.get("SLURMD_NODENAME")
    if slurm_name:
        return slurm_name == host
    return _matches_machine_hostname(host)


def _serve(host: str, port: int, timeout: timedelta) -> TCPStore:
    try:
        return TCPStore(host, port, is_master=True, multi_tenant=True, timeout=timeout)
    except (ValueError, RuntimeError, TimeoutError) as e:
        raise RendezvousRefused(_serve_failure(host, port, e)) from e


def _serve_failure(host: str, port: int, error: BaseException) -> str:
    """What stopped this node serving the store, in words: the port taken (by whom is not known: another user's
    listener, or a leftover of this user's) is told apart from any other failure (the endpoint's host name not
    resolving, or not reaching this node, a bad port)."""
    said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if "EADDRINUSE" in said or "address already in use" in said.lower():
        return (f"this node hosts the job's rendezvous but cannot listen on port {port}: another process holds it "
                f"({said}); not joining whatever listens there (it is not this job's store). The next attempt "
                f"picks another port")
    return (f"this node hosts the job's rendezvous but cannot serve its store at {host}:{port}: {said}. Check "
            f"that {host!r} names this node and resolves here; not joining any other store")


def _join(host: str, port: int, timeout: timedelta, proof_key: str, proof: str) -> TCPStore:
    """A client of the store at host:port, once the store shows this job's proof."""
    try:
        store = TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)
        found = store.get(proof_key).decode(errors="replace")
    except (ValueError, RuntimeError, TimeoutError) as e:
        raise RendezvousRefused(
            f"the rendezvous store at {host}:{port} shows no proof that this job's host node started it within "
            f"{timeout.total_seconds():.0f}s ({e}): another process listens there, or the host node failed; "
            f"refused, nothing written to it") from e
    if not hmac.compare_digest(found, proof):
        raise RendezvousRefused(f"the rendezvous store at {host}:{port} shows another proof than this job's: it is "
                                f"not this job's store; refused, nothing written to it")
    return store


def create_handler(params: RendezvousParameters):
    """The `minilmd-c10d` handler: torch's dynamic rendezvous over a store proven to be this job's."""
    secret = _secret()
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=-1)
    if port <= 0:
        raise RendezvousError(f"the minilmd-c10d rendezvous needs an endpoint HOST:PORT, not {params.endpoint!r}")
    read_timeout = params.get_as_int("read_timeout", DEFAULT_READ_TIMEOUT_S) or DEFAULT_READ_TIMEOUT_S
    timeout = timedelta(seconds=max(1, read_timeout))
    proof_key = "minilmd.proof." + _digest(secret, "key")[:32]
    proof = _digest(secret, "host|" + params.run_id)
    if is_host(params, host):
        store = _serve(host, port, timeout)
        store.set(proof_key, proof)
    else:
        store = _join(host, port, timeout, proof_key, proof)
    params.run_id = f"{params.run_id}-{_digest(secret, 'run|' + params.run_id)[:24]}"
    return dynamic_handler(store, _Backend(store, params.run_id, secret), params)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _refuse_without_secret(argv)
    rendezvous_handler_registry.register(BACKEND, create_handler)
    # torch's opt-out of the shared store: rank 0's agent would then pick the workers' port by binding and closing
    # it, and rank 0's worker listen there later: another user could take the port in between and the other
    # ranks meet in his store. The shared store is bound by the agent itself and held (trainer/loop/distributed.py)
    os.environ.pop(SHARE_OPT_OUT_ENV, None)
    from minilmd.trainer.loop.torchrun import run  # the ranks' own exit status, as on one server

    run(argv)


if __name__ == "__main__":
    from minilmd import terminal

    # torchrun's report of a failed rank quotes its error: printable, as the CLI's; the handlers torch's import above
    # gave its loggers are pointed at the wrapper too
    terminal.escape_std_streams()
    main()
