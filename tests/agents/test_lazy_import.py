"""The server imports agents.protocol, which imports the package: no torch there."""

import subprocess
import sys

from .conftest import REPO


def test_protocol_import_does_not_import_torch():
    code = (
        "import agents.protocol, sys; assert 'torch' not in sys.modules, 'torch imported'; "
        "import agents; assert callable(agents.attach) and callable(agents.fingerprint); "
        "assert 'torch' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_fingerprint_stays_the_public_function_after_the_agent_loads_its_modules():
    import types

    import torch

    import agents
    import agents.fingerprinting as module
    import agents.grads  # noqa: F401  (what attach() loads)

    t = torch.arange(7, dtype=torch.float32)
    assert not isinstance(agents.fingerprint, types.ModuleType)
    assert agents.fingerprint(t) == module.fingerprint(t)
