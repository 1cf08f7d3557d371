"""A tiny text-embedding model folder built in tests: a real WordPiece tokenizer and a tiny,
randomly initialised BERT-like encoder in ONNX (onnx helper ops; no torch).

The folder looks like a sentence-transformers export: tokenizer.json (which, like the
all-MiniLM-L6-v2 package's, carries truncation at 128 and fixed padding to 128: wrong on
purpose), sentence_bert_config.json, config.json, modules.json and 1_Pooling/config.json.
The encoder has one masked self-attention layer, so a padded position changes nothing
only if the attention mask is fed right: what sub-batching and padding tests rely on.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

HIDDEN = 16
POSITIONS = 512
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cat", "sat", "on", "mat", "hello", "world", "a", "dog", "ran", "##s", "##ing", "##ed"]


def vocabulary() -> dict[str, int]:
    """Specials, a few words, every lowercase letter and digit alone and as a ##suffix, punctuation."""
    tokens = [*SPECIALS, *WORDS]
    for char in string.ascii_lowercase + string.digits:
        tokens += [char, f"##{char}"]
    tokens += list("!?.,;:'\"-()")
    seen: dict[str, int] = {}
    for token in tokens:
        seen.setdefault(token, len(seen))
    return seen


def build_tokenizer() -> Tokenizer:
    """A BERT-style (uncased WordPiece) tokenizer, saved with the misleading 128 settings."""
    vocab = vocabulary()
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.enable_truncation(max_length=128)
    tokenizer.enable_padding(length=128, pad_id=vocab["[PAD]"], pad_token="[PAD]")
    return tokenizer


def build_encoder(path: Path, vocab_size: int, seed: int = 0) -> Path:
    """input_ids, attention_mask, token_type_ids int64 [N, T] -> last_hidden_state float32 [N, T, HIDDEN]."""
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int, scale: float = 0.5) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    def const(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(value, name)

    initializers = [
        weight("word_embeddings", vocab_size, HIDDEN),
        weight("position_embeddings", POSITIONS, HIDDEN),
        weight("type_embeddings", 2, HIDDEN),
        weight("wq", HIDDEN, HIDDEN),
        weight("wk", HIDDEN, HIDDEN),
        weight("wv", HIDDEN, HIDDEN),
        const("ln_scale", np.ones(HIDDEN, np.float32)),
        const("ln_bias", np.zeros(HIDDEN, np.float32)),
        const("one_i", np.array(1, np.int64)),
        const("zero_i", np.array(0, np.int64)),
        const("one_f", np.array(1.0, np.float32)),
        const("neg_big", np.array(-10000.0, np.float32)),
        const("scale", np.array(1.0 / np.sqrt(HIDDEN), np.float32)),
        const("axis1", np.array([1], np.int64)),
    ]
    nodes = [
        helper.make_node("Gather", ["word_embeddings", "input_ids"], ["word"]),
        helper.make_node("Gather", ["type_embeddings", "token_type_ids"], ["types"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one_i"], ["seq_len"], axis=0),
        helper.make_node("Range", ["zero_i", "seq_len", "one_i"], ["positions"]),
        helper.make_node("Gather", ["position_embeddings", "positions"], ["pos"]),
        helper.make_node("Add", ["word", "types"], ["sum1"]),
        helper.make_node("Add", ["sum1", "pos"], ["sum2"]),
        helper.make_node("LayerNormalization", ["sum2", "ln_scale", "ln_bias"], ["h0"], axis=-1),
        helper.make_node("MatMul", ["h0", "wq"], ["q"]),
        helper.make_node("MatMul", ["h0", "wk"], ["k"]),
        helper.make_node("MatMul", ["h0", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["raw_scores"]),
        helper.make_node("Mul", ["raw_scores", "scale"], ["scores"]),
        # padded keys get -10000 before the softmax: they take no part in any token's vector
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one_f", "mask_f"], ["inverted"]),
        helper.make_node("Mul", ["inverted", "neg_big"], ["bias2d"]),
        helper.make_node("Unsqueeze", ["bias2d", "axis1"], ["bias3d"]),
        helper.make_node("Add", ["scores", "bias3d"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"]),
        helper.make_node("Add", ["h0", "context"], ["residual"]),
        helper.make_node("LayerNormalization", ["residual", "ln_scale", "ln_bias"], ["last_hidden_state"], axis=-1),
    ]
    int_input = TensorProto.INT64
    graph = helper.make_graph(
        nodes,
        "tiny_bert",
        [
            helper.make_tensor_value_info("input_ids", int_input, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", int_input, ["batch", "sequence"]),
            helper.make_tensor_value_info("token_type_ids", int_input, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def build_text_model_folder(
    folder: Path,
    *,
    max_seq_length: int | None = 256,
    pooling: str = "mean",
    normalize: bool = True,
    positions: int = POSITIONS,
) -> Path:
    """A sentence-transformers-like folder; `max_seq_length=None` leaves sentence_bert_config.json out."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    build_encoder(folder / "model.onnx", tokenizer.get_vocab_size())
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": positions}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    flags = {
        "word_embedding_dimension": HIDDEN,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken",
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    return folder


def build_classifier_folder(folder: Path, labels: tuple[str, ...] = ("negative", "positive")) -> Path:
    """A text classifier: the tiny encoder with a head on its first ([CLS]) token -> logits [N, classes].

    config.json names the classes (`id2label`), as a Hugging Face export does.
    """
    build_text_model_folder(folder, pooling="cls", normalize=False)
    encoder = onnx.load(str(folder / "model.onnx"))
    graph = encoder.graph
    rng = np.random.default_rng(1)
    head = (rng.standard_normal((HIDDEN, len(labels))) * 2.0).astype(np.float32)
    graph.initializer.extend(
        [numpy_helper.from_array(head, "head"), numpy_helper.from_array(np.array(0, np.int64), "first")]
    )
    graph.node.extend(
        [
            helper.make_node("Gather", ["last_hidden_state", "first"], ["cls"], axis=1),
            helper.make_node("MatMul", ["cls", "head"], ["logits"]),
        ]
    )
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(labels)]))
    onnx.checker.check_model(encoder)
    onnx.save(encoder, str(folder / "model.onnx"))
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {str(i): name for i, name in enumerate(labels)}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def text_settings_file(folder: Path, task: str, key: str, extra: str = "", *, old_layout: bool = False) -> Path:
    """Settings for a tiny text model in `folder` (name "tiny-text", one API key, short inputs); `extra`
    is appended to `[task]`. `old_layout`: with `[model] labels = ""`, as files written before tasks had
    tables of their own (they still load, with a warning)."""
    config = folder / "onnxpool.toml"
    labels = 'labels = ""\n' if old_layout else ""
    config.write_text(
        f'[model]\nname = "tiny-text"\npath = "model.onnx"\n{labels}task = "{task}"\n'
        f'[auth]\napi_keys = ["{key}"]\nprotect_metrics = false\n[task]\nmax_batch = 8\nmax_length = 48\n{extra}'
    )
    return config
