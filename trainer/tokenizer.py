"""Tokenizers behind one small protocol: a byte-level one built locally, and an adapter for Hugging Face ones.

The byte tokenizer maps every byte to its own id (0-255) and adds pad / bos / eos. It needs no files and no
hub, so the tiny policy runs anywhere. It can also export itself as a Hugging Face fast tokenizer with the same
ids, so a checkpoint directory is loadable by ``AutoTokenizer`` and servable by vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

BYTE_PAD, BYTE_BOS, BYTE_EOS = 256, 257, 258
BYTE_VOCAB = 259
TOKENIZER_INFO = "litstream_tokenizer.json"


@runtime_checkable
class Tokenizer(Protocol):
    kind: str  # "byte" or "hf": how a checkpoint restores it
    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...

    def save(self, directory: str | Path) -> None: ...


class ByteTokenizer:
    kind = "byte"
    vocab_size = BYTE_VOCAB
    pad_id = BYTE_PAD
    bos_id: int | None = BYTE_BOS
    eos_id = BYTE_EOS

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BYTE_BOS, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        out = bytearray()
        for i in ids:
            if 0 <= i < 256:
                out.append(i)
            elif not skip_special:
                out.extend({BYTE_PAD: b"<pad>", BYTE_BOS: b"<s>", BYTE_EOS: b"</s>"}.get(i, b"<unk>"))
        # A sampled byte sequence need not be valid UTF-8.
        return out.decode("utf-8", errors="replace")

    def to_hf(self) -> Any:
        """The same ids as a ``PreTrainedTokenizerFast`` (byte-level BPE with no merges)."""
        from tokenizers import Tokenizer as RawTokenizer
        from tokenizers import decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

        # ByteLevel pre-tokenization turns byte b into the printable char bytes_to_unicode()[b]: give that char id b.
        vocab = {ch: b for b, ch in bytes_to_unicode().items()}
        vocab.update({"<pad>": BYTE_PAD, "<s>": BYTE_BOS, "</s>": BYTE_EOS})
        raw = RawTokenizer(models.BPE(vocab=vocab, merges=[]))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        raw.decoder = decoders.ByteLevel()
        raw.add_special_tokens(["<pad>", "<s>", "</s>"])
        return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                       clean_up_tokenization_spaces=False)

    def save(self, directory: str | Path) -> None:
        self.to_hf().save_pretrained(str(directory))
        _write_info(directory, self.kind)


class HFTokenizer:
    """Adapts a Hugging Face tokenizer (e.g. SmolLM2's) to the protocol."""

    kind = "hf"

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.vocab_size = len(tok)
        if tok.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token")
        self.eos_id = int(tok.eos_token_id)
        self.bos_id = None if tok.bos_token_id is None else int(tok.bos_token_id)
        # Padding positions are masked out, so any id works; eos is the usual stand-in.
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id

    @classmethod
    def from_pretrained(cls, path: str | Path) -> HFTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False))
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=skip_special))

    def save(self, directory: str | Path) -> None:
        self.tok.save_pretrained(str(directory))
        _write_info(directory, self.kind)


def align_with_model(tok: Any, model: Any) -> Any:
    """``tok`` (a Hugging Face tokenizer) made to agree with ``model`` where a conversion left them apart, as
    SmolLM2's GGUF conversion does: end-of-sequence becomes the token the model ends its turns with (its generation
    config's, where vLLM stops too: ``<|im_end|>``, not ``<|im_start|>``), padding with it where padding was the
    old end; and a byte-level BPE gets the plain ByteLevel decoder (``byte_level_decoding``), which Hugging Face,
    llguidance and vLLM all read the same way. Any other tokenizer is returned as it was."""
    import json

    from tokenizers import decoders

    wanted = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(wanted, list | tuple):
        wanted = wanted[0] if wanted else None
    if wanted is not None and tok.eos_token_id != wanted:
        old = tok.eos_token_id
        tok.eos_token = tok.convert_ids_to_tokens(int(wanted))
        if tok.pad_token_id is None or tok.pad_token_id == old:
            tok.pad_token = tok.eos_token
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and _needs_byte_level_decoder(json.loads(backend.to_str())):
        backend.decoder = decoders.ByteLevel()
    return tok


def byte_level_decoding(tokenizer_json: str) -> str:
    """A ``tokenizer.json`` whose decoder says what its pre-tokenizer did to the bytes. A byte-level BPE (GPT-2's
    scheme: each byte a printable stand-in, "Ċ" for a newline) converted from GGUF, as SmolLM2's is, comes with a
    SentencePiece-style decoder sequence (ByteFallback, Fuse, Replace, ByteLevel) that Hugging Face decodes right
    but llguidance reads as text in its own right: it would take "Ċ" for those two characters, not a newline, and
    reject the tokens its own masks allowed. Such a tokenizer gets the plain ByteLevel decoder; any other is
    returned unchanged. Padding and truncation are dropped (llguidance tokenizes whole texts)."""
    import json

    spec = json.loads(tokenizer_json)
    spec["padding"] = spec["truncation"] = None
    if _needs_byte_level_decoder(spec):
        spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False}
    return json.dumps(spec)


def _needs_byte_level_decoder(spec: dict[str, Any]) -> bool:
    """A byte-level pre-tokenizer with any decoder but the plain ByteLevel one."""

    def kinds(part: dict[str, Any] | None, key: str) -> list[str]:
        if not part:
            return []
        return [part["type"]] + [k for sub in part.get(key) or [] for k in kinds(sub, key)]

    return ("ByteLevel" in kinds(spec.get("pre_tokenizer"), "pretokenizers")
            and kinds(spec.get("decoder"), "decoders") != ["ByteLevel"])


def _write_info(directory: str | Path, kind: str) -> None:
    import json

    (Path(directory) / TOKENIZER_INFO).write_text(json.dumps({"kind": kind}))


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer a checkpoint directory was saved with."""
    import json

    info_path = Path(directory) / TOKENIZER_INFO
    kind = json.loads(info_path.read_text())["kind"] if info_path.exists() else "hf"
    if kind == "byte":
        return ByteTokenizer()
    return HFTokenizer.from_pretrained(directory)
