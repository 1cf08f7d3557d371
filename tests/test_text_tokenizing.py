"""onnxpool.tasks.text.tokenizing: the model's limit (not tokenizer.json's), padding, errors, ids, threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from onnxpool.tasks.text.tokenizing import (
    ENV_PARALLELISM,
    ENV_RAYON_THREADS,
    InputTooLong,
    InvalidTokenId,
    TextTokenizer,
    configure_threads,
    model_max_length,
)
from tests.harness import REPO
from tests.text_models import build_text_model_folder, vocabulary

VOCAB = vocabulary()
CLS, SEP, PAD = VOCAB["[CLS]"], VOCAB["[SEP]"], VOCAB["[PAD]"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_text_model_folder(tmp_path_factory.mktemp("text") / "model", max_seq_length=256)


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> TextTokenizer:
    return TextTokenizer.from_folder(folder)


def words(n: int) -> str:
    """A text of exactly n tokens without special tokens ("cat" is one token)."""
    return " ".join(["cat"] * n)


def test_limit_comes_from_the_model_not_tokenizer_json(folder: Path, tokenizer: TextTokenizer) -> None:
    shipped = json.loads((folder / "tokenizer.json").read_text())
    assert shipped["truncation"]["max_length"] == 128 and shipped["padding"]["strategy"] == {"Fixed": 128}
    assert tokenizer.max_length == 256
    batch = tokenizer.encode([words(200)])
    assert batch.lengths.tolist() == [202]  # not cut at 128
    assert batch.input_ids.shape == (1, 202)  # not padded to 128 either


def test_limit_falls_back_to_position_count_then_fails(tmp_path: Path) -> None:
    folder = build_text_model_folder(tmp_path / "m", max_seq_length=None, positions=64)
    assert model_max_length(folder) == 64
    assert TextTokenizer.from_folder(folder).max_length == 64
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no length limit found"):
        model_max_length(folder)
    assert TextTokenizer.from_folder(folder, max_length=10).max_length == 10


def test_batch_is_padded_to_its_longest_with_int64_arrays(tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode(["hello world", "cat", words(5)])
    assert batch.lengths.tolist() == [4, 3, 7]
    for array in (batch.input_ids, batch.attention_mask, batch.token_type_ids):
        assert array.dtype == np.int64 and array.shape == (3, 7)
    assert batch.input_ids[0].tolist() == [CLS, VOCAB["hello"], VOCAB["world"], SEP, PAD, PAD, PAD]
    assert batch.attention_mask.tolist()[1] == [1, 1, 1, 0, 0, 0, 0]
    assert batch.attention_mask.sum(axis=1).tolist() == batch.lengths.tolist()
    assert not batch.token_type_ids.any()
    assert batch.token_count == 14


def test_feeds_hold_only_the_models_inputs(folder: Path) -> None:
    two = TextTokenizer.from_folder(folder, input_names=("input_ids", "attention_mask"))
    assert sorted(two.encode(["cat"]).feeds()) == ["attention_mask", "input_ids"]
    with pytest.raises(ValueError, match="need input_ids"):
        TextTokenizer.from_folder(folder, input_names=("attention_mask", "pixel_values"))


def test_too_long_is_an_error_naming_index_and_count(tokenizer: TextTokenizer) -> None:
    with pytest.raises(InputTooLong) as caught:
        tokenizer.encode(["cat", words(254), words(300)])
    assert (caught.value.index, caught.value.tokens, caught.value.limit) == (2, 302, 256)
    assert "input 2 has 302 tokens" in str(caught.value) and "256" in str(caught.value)
    assert tokenizer.encode([words(254)]).lengths.tolist() == [256]  # exactly the limit is fine


def test_truncate_cuts_to_the_limit_keeping_special_tokens(tokenizer: TextTokenizer) -> None:
    assert tokenizer.count_tokens(["cat", words(300), ""]).tolist() == [3, 302, 2]
    batch = tokenizer.encode(["cat", words(300)], truncate=True)
    assert batch.lengths.tolist() == [3, 256]
    assert batch.input_ids[1, 0] == CLS and batch.input_ids[1, 255] == SEP


def test_empty_string_is_the_special_tokens_alone(tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode(["", "   "])
    assert batch.lengths.tolist() == [2, 2]
    assert batch.input_ids.tolist() == [[CLS, SEP], [CLS, SEP]]


def test_token_ids_get_the_models_special_tokens(tokenizer: TextTokenizer) -> None:
    from_text = tokenizer.encode(["the cat sat", ""])
    ids = [[VOCAB["the"], VOCAB["cat"], VOCAB["sat"]], []]
    from_ids = tokenizer.encode_ids(ids)
    for name in ("input_ids", "attention_mask", "token_type_ids", "lengths"):
        assert np.array_equal(getattr(from_ids, name), getattr(from_text, name)), name
    assert tokenizer.special_tokens == 2


def test_token_ids_are_checked_and_limited(tokenizer: TextTokenizer) -> None:
    with pytest.raises(InvalidTokenId, match="input 1 has token id 99 at position 2"):
        tokenizer.encode_ids([[5], [5, 6, tokenizer.vocab_size]])
    with pytest.raises(InvalidTokenId, match="-1"):
        tokenizer.encode_ids([[-1]])
    with pytest.raises(InputTooLong) as caught:
        tokenizer.encode_ids([[5] * 255])
    assert (caught.value.index, caught.value.tokens) == (0, 257)
    cut = tokenizer.encode_ids([[5] * 300], truncate=True)
    assert cut.lengths.tolist() == [256] and cut.input_ids[0, -1] == SEP


def test_select_takes_rows_in_order_trimmed_to_their_longest(tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode([words(10), "cat", "hello world"])
    part = batch.select([2, 1])
    assert part.input_ids.shape == (2, 4)
    assert part.lengths.tolist() == [4, 3]
    assert np.array_equal(part.input_ids, batch.input_ids[[2, 1], :4])
    assert part.input_names == batch.input_names


def test_configure_threads_sets_what_tokenizers_reads() -> None:
    env: dict[str, str] = {}
    configure_threads(3, env)
    assert env == {ENV_RAYON_THREADS: "3", ENV_PARALLELISM: "true"}
    configure_threads(1, env)
    assert env == {ENV_RAYON_THREADS: "1", ENV_PARALLELISM: "false"}
    with pytest.raises(ValueError):
        configure_threads(0, env)


THREAD_PROBE = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from onnxpool.tasks.text.tokenizing import TextTokenizer, configure_threads
    tokenizer = TextTokenizer.from_folder(Path(sys.argv[1]))
    before = len(os.listdir("/proc/self/task"))
    configure_threads(int(sys.argv[2]))
    for _ in range(3):
        tokenizer.encode(["the cat sat on the mat " * 20] * 64)
    print(before, len(os.listdir("/proc/self/task")))
""")


def threads_after_encoding(folder: Path, threads: int) -> tuple[int, int]:
    # OpenBLAS (numpy) starts its own threads at import: one, so they do not blur the count.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    for name in (ENV_PARALLELISM, ENV_RAYON_THREADS):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", THREAD_PROBE, str(folder), str(threads)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    before, after = done.stdout.split()
    return int(before), int(after)


def test_the_tokenizer_pool_has_the_configured_size_and_only_after_the_first_encode(folder: Path) -> None:
    before_one, after_one = threads_after_encoding(folder, 1)
    before_three, after_three = threads_after_encoding(folder, 3)
    assert before_one == before_three  # loading tokenizer.json starts no thread
    assert after_one == before_one  # one thread: no pool at all
    assert after_three == before_three + 3  # a rayon pool of exactly 3
