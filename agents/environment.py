"""What the rank runs on, for the `rank_start` event (versions, configs, env, cache dirs)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import platform
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch

from agents.normalize import normalize
from agents.protocol import PER_LAUNCH_ENV

ENV_PREFIXES = ("TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "NCCL_", "TORCHELASTIC_", "TRITON_")
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|(^|_)KEY($|_)", re.I)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": str(torch.__version__)}
    try:
        out["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    try:
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:
        pass
    driver = _driver_version()
    if driver:
        out["driver"] = driver
    if getattr(torch.version, "hip", None):
        out["hip"] = str(torch.version.hip)
    out.update(_library_versions())
    return out


def _library_versions() -> dict[str, str]:
    """cuDNN and NCCL as torch loaded them (absent on CPU builds: nothing is guessed)."""
    out = {}
    try:
        if torch.backends.cudnn.is_available():
            out["cudnn"] = str(torch.backends.cudnn.version())
    except Exception:
        pass
    try:
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:
        pass
    return out


def _driver_version() -> str | None:
    """NVIDIA kernel driver version from /proc (no NVML needed); None elsewhere."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module(?: for [^ ]+)?\s+([0-9.]+)", f.read())
        return m.group(1) if m else None
    except OSError:
        return None


def device(computes_on: torch.device | None = None) -> str:
    """The device this rank computes on: its parameters' (`computes_on`) once known, else CUDA's
    current device once CUDA is initialized; "" while a CUDA rank has not touched the GPU yet. Never
    the local rank: ranks that share one GPU (or pick theirs by other means) all say where they are."""
    if computes_on is not None:
        return str(computes_on)
    try:
        if not torch.cuda.is_available():
            return "cpu"
        if torch.cuda.is_initialized():
            return f"cuda:{torch.cuda.current_device()}"
    except Exception:
        pass
    return ""


def canonical(value: object) -> str:
    """Text of a config value that is the same in every process: sets and dicts sorted (their repr
    follows the process's hash seed, so the same config printed differently on every rank of every
    run), object addresses normalized away."""
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(canonical(v) for v in value)) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{canonical(k)}: {canonical(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(canonical(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return normalize(repr(value))


def config_hash() -> str:
    """Hash of the Inductor + Dynamo configs, over `canonical` values: equal configs hash alike in
    every process."""
    h = hashlib.blake2b(digest_size=16)
    for modname in ("torch._inductor.config", "torch._dynamo.config"):
        try:
            mod = __import__(modname, fromlist=["get_config_copy"])
            cfg = mod.get_config_copy()
            h.update(repr(sorted((k, canonical(v)) for k, v in cfg.items())).encode())
        except Exception:
            h.update(modname.encode())
    return h.hexdigest()


SETTINGS_MODULES = (
    ("dynamo", "torch._dynamo.config"),
    ("inductor", "torch._inductor.config"),
    ("functorch", "torch._functorch.config"),
)


def settings() -> dict[str, str]:
    """Compiler settings that differ from torch's defaults ("inductor.triton.cudagraphs" -> "True"),
    set in code or through the environment, so two runs or two ranks can name the one that differs
    instead of comparing one config hash."""
    out: dict[str, str] = {}
    with warnings.catch_warnings():  # reading a deprecated key warns
        warnings.simplefilter("ignore")
        for prefix, modname in SETTINGS_MODULES:
            out.update(_changed(prefix, modname))
    return out


def _changed(prefix: str, modname: str) -> dict[str, str]:
    """`prefix.key` -> repr of each value of one torch config module that is not its default."""
    try:
        mod = importlib.import_module(modname)
        entries = dict(getattr(mod, "_config", {}))
    except Exception:
        return {}
    out: dict[str, str] = {}
    for key, entry in sorted(entries.items()):
        try:
            if getattr(entry, "alias", None):
                continue
            text = canonical(getattr(mod, key))
            if not _is_default(mod, key, entry, text):
                out[f"{prefix}.{key}"[:512]] = text[:16_384]
        except Exception:
            continue
    return out


def _is_default(mod: object, key: str, entry: object, text: str) -> bool:
    """`text` (the setting's value, `canonical`) is its default's, or torch says it is not overridden."""
    if text == canonical(getattr(entry, "default", object())):
        return True
    check = getattr(mod, "_is_default", None)  # torch >= 2.5 tells environment overrides from defaults
    return bool(check(key)) if callable(check) else False


def filtered_env() -> dict[str, str]:
    """Compiler/collective-relevant environment, secrets redacted; what names only this launch
    (`protocol.PER_LAUNCH_ENV`) is left out, so two launches of one job send the same."""
    return {
        k[:512]: ("<redacted>" if _SECRET.search(k) else v[:16_384])
        for k, v in sorted(os.environ.items())
        if k.startswith(ENV_PREFIXES) and k not in PER_LAUNCH_ENV
    }


NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "9p",
        "fuse.sshfs",
        "wekafs",
        "fuse.juicefs",
        "fuse.s3fs",
        "afs",
    }
)


def cache_locations(dirs: dict[str, str]) -> dict[str, dict[str, str | bool]]:
    """Per cache dir: resolved path, filesystem type, whether other hosts can mount it, and if so its id.
    A local filesystem's id names only this node's disk, which the host already does: left out, every
    rank of a job reports the same locations, and the server keeps them once (`Rank.facts_key`)."""
    mounts = _mounts()
    out: dict[str, dict[str, str | bool]] = {}
    for name, path in dirs.items():
        try:
            real = os.path.realpath(path)
            fs = _fs_type(real, mounts)
            out[name] = {"path": real, "fs": fs, "shared": fs in NETWORK_FS}
            if fs in NETWORK_FS:
                out[name]["fsid"] = format(os.statvfs(_existing(real)).f_fsid, "x")
        except OSError:
            continue
    return out


def _existing(path: str) -> str:
    """The deepest existing directory of `path` (a cache dir may not exist before the first compile)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return path or "/"


def _mounts() -> list[tuple[str, str]]:
    """(mount point, fs type), longest mount point first."""
    try:
        with open("/proc/mounts") as f:
            rows = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return []
    return sorted(((point.replace("\\040", " "), kind) for point, kind in rows), key=lambda r: -len(r[0]))


def _fs_type(path: str, mounts: list[tuple[str, str]]) -> str:
    for point, kind in mounts:
        if path == point or path.startswith(point.rstrip("/") + "/"):
            return kind
    return ""


def codegen() -> dict[str, str]:
    """Facts that change the code Inductor generates but not its cache keys: the CPU vector ISA
    (`ATEN_CPU_CAPABILITY`, or the node's CPU) picks the vector width of C++ kernels, and a cached
    kernel built for another width computes garbage (reproduced on torch 2.13)."""
    try:
        return {"cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
    except Exception:
        return {}


def cache_dirs() -> dict[str, str]:
    out = {}
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        out["inductor"] = cache_dir()
    except Exception:
        pass
    if os.environ.get("TRITON_CACHE_DIR"):
        out["triton"] = os.environ["TRITON_CACHE_DIR"]
    return out


def collective_timeout_s() -> float | None:
    """The default process group's timeout, when a group is already initialized.

    torch < 2.2 keeps it on `ProcessGroup.options`; later versions on each backend's options
    (`pg._get_backend(device).options`), NCCL's on the CUDA backend, gloo's on the CPU one."""
    try:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        pg = dist.distributed_c10d._get_default_group()

        def backend(device: str) -> Any:
            return pg._get_backend(torch.device(device)).options

        options: list[Callable[[], Any]] = [
            lambda: pg.options,  # type: ignore[attr-defined]  # torch < 2.2 only
            lambda: backend("cuda"),
            lambda: backend("cpu"),
        ]
        for get in options:
            try:
                return float(get()._timeout.total_seconds())
            except Exception:
                continue
    except Exception:
        pass
    return None
