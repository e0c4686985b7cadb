"""Commands of the meta-tests forked from a warm server (:mod:`rlconform.forkserver`) when one can start:
the same command, working directory and environment, without importing torch again for each."""
from __future__ import annotations

import subprocess
import tempfile
from typing import Sequence

from rlconform.forkserver import ForkServer, ForkServerError


def warm_server(modules: Sequence[str], **kwargs) -> ForkServer | None:
    """A server that preloaded ``modules`` (see :class:`ForkServer`), or None where none can start."""
    try:
        return ForkServer(modules, **kwargs)
    except ForkServerError:
        return None


def run(server: ForkServer | None, args: Sequence[str], *, cwd, env: dict | None = None,
        timeout: float) -> subprocess.CompletedProcess:
    """As ``subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)`` with
    stdin from /dev/null; forked from ``server`` unless it is None (``args``: ``python -m ...`` then)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        launch = server.popen if server is not None else subprocess.Popen
        proc = launch(list(args), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(list(args), code, out.read(), err.read())
