"""Byte-level tokenizer: every UTF-8 byte is a token, plus three special ids.

Bytes need no vocabulary file and no download, encode any text (code, prose, a user's files) without
unknown tokens, and make a corpus's token count equal its byte count -- so tokens/s and bytes/s are
the same number and perplexities of different corpora stay comparable per byte.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["BOS", "EOS", "PAD", "VOCAB_SIZE", "ByteTokenizer"]

#: Beginning of a sequence (used by the synthetic task; corpora are continuous streams).
BOS: int = 256
#: End of a document: separates files / documentation topics inside a token stream.
EOS: int = 257
#: Padding (never a training target).
PAD: int = 258
#: 256 byte ids + the three specials.
VOCAB_SIZE: int = 259


class ByteTokenizer:
    """Text <-> token ids, ids 0..255 being the bytes of the UTF-8 encoding.

    ``decode`` drops special ids (unless ``keep_special``) and replaces invalid UTF-8 (a window cut in
    the middle of a multi-byte character) with U+FFFD instead of failing.
    """

    bos: int = BOS
    eos: int = EOS
    pad: int = PAD
    vocab_size: int = VOCAB_SIZE
    specials: dict[int, str] = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}

    def encode(self, text: str | bytes, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``text`` (a str is encoded as UTF-8 first), optionally framed by BOS/EOS."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids = list(data)
        if bos:
            ids.insert(0, BOS)
        if eos:
            ids.append(EOS)
        return ids

    def encode_tensor(self, text: str | bytes, bos: bool = False, eos: bool = False) -> torch.Tensor:
        """Like ``encode`` but a 1-D int64 tensor, ready for the model."""
        return torch.tensor(self.encode(text, bos=bos, eos=eos), dtype=torch.long)

    def decode(self, ids: Iterable[int] | torch.Tensor, keep_special: bool = False) -> str:
        """Text of ``ids``; specials are dropped, or shown as ``<bos>``/``<eos>``/``<pad>``."""
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().tolist()
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if i not in self.specials:
                raise ValueError(f"token id {i} is outside the byte vocabulary (0..{VOCAB_SIZE - 1})")
            if keep_special:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                out.append(self.specials[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)
