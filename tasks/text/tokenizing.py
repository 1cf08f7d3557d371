"""Text (or token ids) -> the model's int64 input arrays, with the model's own length limit.

The tokenizer is Hugging Face `tokenizers` (Rust), read from the model folder's
`tokenizer.json`. That file also carries padding and truncation settings, which are NOT
the model's: the all-MiniLM-L6-v2 package ships truncation at 128 tokens and fixed padding
to 128 while the model was trained for, and sentence-transformers runs it at, 256
(`sentence_bert_config.json` `max_seq_length`). So both are switched off here: the limit
comes from the model's configuration (`model_max_length`), and a batch is padded to its
longest input, never to a fixed length (padding costs compute on every layer).

Length limit (special tokens included, as the model sees them): by default an input over
it is an error (`InputTooLong`, naming the input's index and its token count); with
`truncate=True` it is cut to the limit, special tokens kept (sentence-transformers' rule).

Empty string: it tokenizes to the special tokens alone (BERT: `[CLS] [SEP]`, 2 tokens) and
gets an embedding like any other input, exactly as sentence-transformers gives one; it is
not an error. An empty token-id list is treated the same way.

Threads and fork: see `configure_threads`.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

# The model inputs a BERT-style encoder may have; a model takes a subset (its input names).
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
KNOWN_INPUTS: tuple[str, ...] = (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS)

# What `tokenizers` honours for its thread pool (tokenizers/src/utils/parallelism.rs, and
# rayon-core, which it uses):
# - TOKENIZERS_PARALLELISM is read on EVERY batch call: false/0/off/no/"" = encode serially
#   in the calling thread, anything else (or unset) = use rayon's global thread pool.
# - rayon's global pool is created lazily, on the first parallel call, and then lives for
#   the whole process; its size is RAYON_NUM_THREADS read at that moment (else the number of
#   CPUs Rust sees). Setting the variable after the pool exists changes nothing.
# - Python's `os.environ[...] = ...` calls putenv(), so Rust's std::env::var sees it.
# - After a fork, the Python binding's atfork handler turns parallelism OFF in the child
#   (with a warning on stderr) if the parent had used it and TOKENIZERS_PARALLELISM was not
#   set: the parent's pool threads do not exist in the child.
# Hence the rule: the gunicorn master may read a tokenizer (loading tokenizer.json starts
# no thread) but never encodes a batch with it; each worker calls `configure_threads` after
# fork, before its first encode, with its own core count, so the pool it creates is sized
# to its share of the cores, next to (not on top of) onnxruntime's intra-op threads, which
# run at a different moment of the request.
ENV_PARALLELISM = "TOKENIZERS_PARALLELISM"
ENV_RAYON_THREADS = "RAYON_NUM_THREADS"

SENTENCE_BERT_CONFIG = "sentence_bert_config.json"
MODEL_CONFIG = "config.json"
TOKENIZER_FILE = "tokenizer.json"


def configure_threads(threads: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Size the tokenizer's thread pool for this process: call in the worker after fork.

    `threads` is the worker's core count (its share). One thread means no pool at all
    (encoding runs in the request's thread); more means a rayon pool of exactly that many
    threads, created at the first batch encode. Must run before the process's first
    `encode`; see the comment above ENV_PARALLELISM.
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    env = os.environ if environ is None else environ
    env[ENV_RAYON_THREADS] = str(threads)
    env[ENV_PARALLELISM] = "true" if threads > 1 else "false"


class TokenizingError(ValueError):
    """An input the model cannot take; the message names the input and the problem (an HTTP 400)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.message = message
        self.index = index


class InputTooLong(TokenizingError):
    """An input has more tokens than the model's limit (and truncation was not asked for)."""

    def __init__(self, index: int, tokens: int, limit: int) -> None:
        super().__init__(
            f"input {index} has {tokens} tokens, more than the model's limit of {limit} "
            "(shorten it, or ask for truncation)",
            index,
        )
        self.tokens = tokens
        self.limit = limit


class InvalidTokenId(TokenizingError):
    """A pre-tokenized input holds an id outside the model's vocabulary."""

    def __init__(self, index: int, position: int, token: int, vocab_size: int) -> None:
        super().__init__(
            f"input {index} has token id {token} at position {position}, "
            f"outside the model's vocabulary (0 to {vocab_size - 1})",
            index,
        )
        self.token = token
        self.vocab_size = vocab_size


def model_max_length(folder: Path) -> int:
    """The model's own input limit in tokens: sentence-transformers' `max_seq_length`, else the
    position count of `config.json` (`max_position_embeddings`). Never `tokenizer.json`'s."""
    sbert = folder / SENTENCE_BERT_CONFIG
    if sbert.is_file():
        value = json.loads(sbert.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    config = folder / MODEL_CONFIG
    if config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(
        f"{folder}: no length limit found ({SENTENCE_BERT_CONFIG} max_seq_length or {MODEL_CONFIG} "
        "max_position_embeddings); pass max_length"
    )


@dataclass(frozen=True)
class EncodedBatch:
    """A padded batch: int64 [N, T] arrays (T = the longest input), right-padded.

    `lengths[i]` is input i's token count (special tokens included, padding not): the
    usage count of OpenAI's API, and what sub-batch planning sorts by.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    lengths: np.ndarray
    input_names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def token_count(self) -> int:
        """Tokens the model reads, padding excluded."""
        return int(self.lengths.sum())

    def feeds(self) -> dict[str, np.ndarray]:
        """The arrays by the model's input names (only the inputs the model has)."""
        arrays = {
            INPUT_IDS: self.input_ids,
            ATTENTION_MASK: self.attention_mask,
            TOKEN_TYPE_IDS: self.token_type_ids,
        }
        return {name: arrays[name] for name in self.input_names}

    def select(self, indices: Sequence[int] | np.ndarray) -> EncodedBatch:
        """Rows `indices`, in that order, trimmed to the longest of them (a sub-batch)."""
        rows = np.asarray(indices, dtype=np.int64)
        width = int(self.lengths[rows].max()) if rows.size else 0
        return EncodedBatch(
            input_ids=np.ascontiguousarray(self.input_ids[rows, :width]),
            attention_mask=np.ascontiguousarray(self.attention_mask[rows, :width]),
            token_type_ids=np.ascontiguousarray(self.token_type_ids[rows, :width]),
            lengths=self.lengths[rows],
            input_names=self.input_names,
        )


@dataclass(frozen=True)
class _Template:
    """The special tokens the model's post-processor puts around one sequence (BERT: [CLS] x [SEP])."""

    prefix_ids: tuple[int, ...]
    prefix_types: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    suffix_types: tuple[int, ...]
    content_type: int

    @property
    def added(self) -> int:
        return len(self.prefix_ids) + len(self.suffix_ids)


def _template_of(tokenizer: Tokenizer) -> _Template:
    """Find the special tokens around a single sequence by encoding a probe with and without them."""
    probe = "hello world"
    plain = tokenizer.encode(probe, add_special_tokens=False)
    full = tokenizer.encode(probe, add_special_tokens=True)
    inner, outer = plain.ids, full.ids
    for start in range(len(outer) - len(inner) + 1):
        if outer[start : start + len(inner)] == inner:
            end = start + len(inner)
            return _Template(
                prefix_ids=tuple(outer[:start]),
                prefix_types=tuple(full.type_ids[:start]),
                suffix_ids=tuple(outer[end:]),
                suffix_types=tuple(full.type_ids[end:]),
                content_type=full.type_ids[start] if inner else 0,
            )
    raise ValueError("the tokenizer's post-processor does not wrap a sequence in fixed special tokens")


def _pad_id_of(tokenizer: Tokenizer) -> int:
    padding = tokenizer.padding
    if padding is not None:
        return int(padding["pad_id"])
    for token in ("[PAD]", "<pad>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


class TextTokenizer:
    """A model's tokenizer with the model's length limit; encodes batches into input arrays.

    Safe to share between threads: it holds two read-only tokenizers (one that never cuts,
    one that cuts at the limit) instead of switching one tokenizer's truncation per call.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int, input_names: Sequence[str] = KNOWN_INPUTS) -> None:
        unknown = [name for name in input_names if name not in KNOWN_INPUTS]
        if unknown or INPUT_IDS not in input_names:
            raise ValueError(f"model inputs {list(input_names)}: need input_ids, may have {list(KNOWN_INPUTS[1:])}")
        self.pad_id = _pad_id_of(tokenizer)
        self._plain = Tokenizer.from_str(tokenizer.to_str())
        self._plain.no_padding()
        self._plain.no_truncation()
        self._template = _template_of(self._plain)
        if max_length <= self._template.added:
            raise ValueError(f"max_length {max_length} leaves no room next to {self._template.added} special tokens")
        self._cutting = Tokenizer.from_str(self._plain.to_str())
        self._cutting.enable_truncation(max_length=max_length)
        self.max_length = max_length
        self.input_names = tuple(input_names)
        self.vocab_size = self._plain.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_folder(
        cls, folder: Path, input_names: Sequence[str] = KNOWN_INPUTS, max_length: int | None = None
    ) -> TextTokenizer:
        """`folder/tokenizer.json` with the limit of `model_max_length(folder)` (or `max_length`)."""
        tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        return cls(tokenizer, max_length if max_length is not None else model_max_length(folder), input_names)

    @property
    def special_tokens(self) -> int:
        """Tokens the model's template adds to each input (BERT: 2)."""
        return self._template.added

    def count_tokens(self, texts: Sequence[str]) -> np.ndarray:
        """Each text's token count with special tokens and WITHOUT the limit (int64 [N])."""
        encodings = self._plain.encode_batch(list(texts), add_special_tokens=True)
        return np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))

    def encode(self, texts: Sequence[str], *, truncate: bool = False) -> EncodedBatch:
        """Tokenize a batch of strings (special tokens added); InputTooLong unless `truncate`."""
        tokenizer = self._cutting if truncate else self._plain
        encodings: list[Encoding] = tokenizer.encode_batch(list(texts), add_special_tokens=True)
        rows: list[tuple[Sequence[int], Sequence[int]]] = []
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                raise InputTooLong(index, len(encoding.ids), self.max_length)
            rows.append((encoding.ids, encoding.type_ids))
        return self._batch(rows)

    def encode_ids(self, token_ids: Sequence[Sequence[int]], *, truncate: bool = False) -> EncodedBatch:
        """A batch of pre-tokenized inputs: ids of the model's vocabulary WITHOUT special tokens
        (as OpenAI's API takes them); the model's special tokens are added around each."""
        t = self._template
        room = self.max_length - t.added
        rows: list[tuple[Sequence[int], Sequence[int]]] = []
        for index, ids in enumerate(token_ids):
            for position, token in enumerate(ids):
                if not 0 <= token < self.vocab_size:
                    raise InvalidTokenId(index, position, token, self.vocab_size)
            if len(ids) > room:
                if not truncate:
                    raise InputTooLong(index, len(ids) + t.added, self.max_length)
                ids = ids[:room]
            rows.append(
                (
                    [*t.prefix_ids, *ids, *t.suffix_ids],
                    [*t.prefix_types, *([t.content_type] * len(ids)), *t.suffix_types],
                )
            )
        return self._batch(rows)

    def _batch(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> EncodedBatch:
        lengths = np.fromiter((len(ids) for ids, _ in rows), dtype=np.int64, count=len(rows))
        width = int(lengths.max()) if len(rows) else 0
        input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        token_type_ids = np.zeros((len(rows), width), dtype=np.int64)
        for row, (ids, types) in enumerate(rows):
            input_ids[row, : len(ids)] = ids
            token_type_ids[row, : len(types)] = types
        attention_mask = (np.arange(width, dtype=np.int64)[None, :] < lengths[:, None]).astype(np.int64)
        return EncodedBatch(input_ids, attention_mask, token_type_ids, lengths, self.input_names)
