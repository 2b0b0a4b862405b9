import torch

from microscope.workloads.tokenizer import BOS, EOS, PAD, VOCAB_SIZE, ByteTokenizer


def test_round_trip_ascii_and_unicode():
    tok = ByteTokenizer()
    for text in ["", "def f(x):\n    return x + 1\n", "naïve café — 数学 🚀", "\x00\x7f"]:
        assert tok.decode(tok.encode(text)) == text
        assert tok.decode(tok.encode_tensor(text, bos=True, eos=True)) == text


def test_ids_are_bytes_and_specials_frame_them():
    tok = ByteTokenizer()
    ids = tok.encode("é", bos=True, eos=True)
    assert ids == [BOS, 0xC3, 0xA9, EOS]
    assert max(ids) < VOCAB_SIZE == tok.vocab_size
    assert tok.decode(ids, keep_special=True) == "<bos>é<eos>"
    assert tok.decode([PAD, 104, 105]) == "hi"


def test_cut_multibyte_character_decodes_with_replacement():
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("é")[:1]) == "\ufffd"


def test_out_of_vocabulary_id_is_an_error():
    tok = ByteTokenizer()
    try:
        tok.decode(torch.tensor([VOCAB_SIZE]))
    except ValueError as exc:
        assert "outside the byte vocabulary" in str(exc)
    else:
        raise AssertionError("expected ValueError")
