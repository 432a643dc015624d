"""The many-devices surface hardened (issue 46): bounded pools and replicas, no serve flag
dropped by disaggregation, a GGUF header that checks its lengths, figures with ranges,
messages that name the flag that was given. Each refusal: one line naming the flag or
field, the value and what is valid; numbers derived by hand in the comments."""
import json
import struct

import pytest

# -- 2. a GGUF header checks every declared length against the bytes left ------------------


def _gguf(*parts: bytes) -> bytes:
    """'GGUF', version 3, 0 tensors, then `parts` (the key count first)."""
    return b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 0) + b"".join(parts)


def _string(text: bytes, declared: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if declared is None else declared) + text


@pytest.mark.parametrize("body, expected", [
    # the issue's file: one key whose name declares 2^60 bytes; 4 + 4 + 8 + 8 + 8 + 12 = 44
    # bytes, the name's 12 left after byte 32
    ((struct.pack("<Q", 1), _string(b"general.arch", 2 ** 60)),
     "a string at byte 32 needs 1,152,921,504,606,846,976 bytes; the file has 12 left"),
    # a string value of 2^40 bytes: key "k" (8 + 1), type 8 (4), its length (8) -> byte 45
    ((struct.pack("<Q", 1), _string(b"k"), struct.pack("<I", 8), _string(b"ab", 2 ** 40)),
     "a string at byte 45 needs 1,099,511,627,776 bytes; the file has 2 left"),
    # an array of 2^61 uint32: 4 bytes each = 2^63 bytes; type 9, inner 4, count -> byte 49
    ((struct.pack("<Q", 1), _string(b"k"), struct.pack("<I", 9), struct.pack("<I", 4),
      struct.pack("<Q", 2 ** 61)),
     "an array of 2,305,843,009,213,693,952 elements at byte 49 needs "
     "9,223,372,036,854,775,808 bytes; the file has 0 left"),
    # an array of 10^12 strings: each at least its 8-byte length = 8e12 bytes
    ((struct.pack("<Q", 1), _string(b"k"), struct.pack("<I", 9), struct.pack("<I", 8),
      struct.pack("<Q", 10 ** 12)),
     "an array of 1,000,000,000,000 elements at byte 49 needs 8,000,000,000,000 bytes"),
    # 50,000 keys (under MAX_KEYS) in a file with none: each key at least 8 + 4 + 1 = 13
    # bytes, 650,000 in all, from byte 24
    ((struct.pack("<Q", 50_000),),
     "50,000 metadata keys at byte 24 needs 650,000 bytes; the file has 0 left"),
])
def test_every_declared_length_is_checked_against_the_bytes_left(tmp_path, body, expected):
    from perfcounter.models.gguf_header import gguf_metadata, gguf_shape
    path = tmp_path / "huge.gguf"
    path.write_bytes(_gguf(*body))
    with pytest.raises(ValueError) as e:
        gguf_metadata(path)
    assert expected in str(e.value)
    assert gguf_shape(path) is None  # the header unread: transformers is asked instead


def test_the_issues_44_byte_file_is_one_line_not_a_memory_error(tmp_path):
    from perfcounter.models.checkpoint_config import checkpoint_config
    from perfcounter.models.checkpoint_files import CheckpointError
    path = tmp_path / "huge_str.gguf"
    path.write_bytes(_gguf(struct.pack("<Q", 1), _string(b"general.arch", 2 ** 60)))
    assert path.stat().st_size == 44
    with pytest.raises(CheckpointError) as e:  # transformers' reader refuses it too
        checkpoint_config(path)
    assert "huge_str.gguf" in str(e.value) and "\n" not in str(e.value)


def test_a_header_within_its_bytes_still_reads(tmp_path):
    from perfcounter.models.gguf_header import gguf_metadata
    path = tmp_path / "ok.gguf"
    # two keys: a string "llama" and an array of 3 strings (skipped, read as its length 3)
    path.write_bytes(_gguf(struct.pack("<Q", 2),
                           _string(b"general.architecture"), struct.pack("<I", 8),
                           _string(b"llama"),
                           _string(b"tokenizer.ggml.tokens"), struct.pack("<I", 9),
                           struct.pack("<I", 8), struct.pack("<Q", 3),
                           _string(b"a"), _string(b"bb"), _string(b"")))
    assert gguf_metadata(path) == {"general.architecture": "llama",
                                   "tokenizer.ggml.tokens": 3}


# -- 7. a counts file's schema named, not a field it lacks ---------------------------------
@pytest.mark.parametrize("doc, says", [
    ({"prefill": {"schema": 99}},
     "phase 'prefill': schema 99 is not a perfcounter counts document's (expected a "
     "'perfcounter' block with \"schema\": 'perfcounter.counts')"),
    ({"perfcounter": {"schema": 99, "version": 2}},  # the block alone, as the document
     "phase 'perfcounter': schema 99 is not a perfcounter counts document's"),
    ({"prefill": {"perfcounter": {"schema": 99}}},
     "phase 'prefill': field 'perfcounter' has schema 99 (expected an object with "
     "\"schema\": 'perfcounter.counts')"),
    ({"schema": 99, "version": 2}, "not a perfcounter counts document (schema 99; "),
])
def test_profile_counts_of_a_schema_99_file_names_the_schema(tmp_path, capsys, doc, says):
    from perfcounter.cli.main import main
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(doc))
    assert main(argv=["profile", "--counts", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"perfcounter profile: error: {path}: ")
    assert says in err and "'label' is missing" not in err
