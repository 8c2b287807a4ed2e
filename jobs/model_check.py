"""The model check that runs before a job is planned (run and submit alike): config, architecture,
tokenizer and safetensors headers, without torch and without reading the weights.

A model the engine would refuse at load is refused here instead, before OUT/manifest.json exists,
so the user fixes the model and reruns the same command. The architecture list and the config
rules are the engine's own (contracts/checkpoint/architectures.py, torch-free).
Checks on the weights read only each file's header (8 bytes of length, then JSON): the tensors'
dtypes, shapes and byte ranges must fit the file, which is how a truncated download shows.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

from contracts.checkpoint.architectures import config_problem
from contracts.checkpoint.pooling import PoolingConfig, PoolingConfigError
from jobs.errors import FreightError, ModelNotFoundError
from jobs.settings import Settings
from jobs.storage import ObjectStore, open_store

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit on a header
# bytes per element of each safetensors dtype (sub-byte and exotic dtypes: offsets checked, not sizes)
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
KNOWN_DTYPES = frozenset(DTYPE_BYTES) | {"F8_E4M3FNUZ", "F8_E5M2FNUZ"}  # what safetensors loads into torch
# A config implying more parameters than this x the checkpoint's elements describes another model (a
# 4-bit GPTQ checkpoint packs 8 weights in an int32 element, MXFP4 two in a byte: 16 covers both);
# worker/engine/model_size.py makes the same check on the model as built.
PACKING_MAX = 16
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def check_model(model: str, settings: Settings | None = None, embed: bool = False) -> dict[str, Any]:
    """Raise ModelNotFoundError, one line naming what is missing or wrong, unless `model` (a folder
    or s3:// prefix) holds a checkpoint the engine can load: config.json of a supported architecture
    with its required keys, tokenizer.json, and safetensors weights whose headers are whole and agree
    with the config; with `embed`, also a sentence-transformers pooling config the engine follows.
    Reads config.json, the tokenizer files, the pooling files and each weight file's header. Returns
    config.json's contents."""

    store = open_store(model, settings)
    config = _config(store, model)
    files = _weight_files(store, model)
    problem = config_problem(config)
    if problem is not None:
        raise ModelNotFoundError(f"model {model}: {problem}")
    _check_tokenizer(store, model)
    if embed:
        _check_pooling(store, model, config)
    headers = {name: _header(store, model, name) for name in files}
    _check_against_config(model, config, headers)
    return config


def check_draft(model: str, draft: str, settings: Settings | None = None) -> None:
    """Raise ModelNotFoundError unless `draft` is a loadable checkpoint (check_model) with `model`'s
    vocabulary size and tokenizer (the same token -> id map, added tokens included): a draft model
    for speculative decoding proposes token ids the model reads."""
    target = check_model(model, settings)
    config = check_model(draft, settings)
    if config.get("vocab_size") != target.get("vocab_size"):
        raise ModelNotFoundError(f"--speculative draft:{draft} has a vocabulary of {config.get('vocab_size')} "
                                 f"tokens, the model {target.get('vocab_size')}; a draft must share the "
                                 "model's tokenizer")  # fmt: skip
    if _vocab(open_store(draft, settings)) != _vocab(open_store(model, settings)):
        raise ModelNotFoundError(f"--speculative draft:{draft} has another tokenizer than the model "
                                 f"{model}; a draft must share the model's tokenizer")  # fmt: skip


def _vocab(store: ObjectStore) -> tuple[Any, Any]:
    parsed = json.loads(store.get("tokenizer.json"))
    added = sorted((t.get("content"), t.get("id")) for t in parsed.get("added_tokens") or [])
    return parsed["model"].get("vocab"), added


def _config(store: ObjectStore, model: str) -> Any:
    if not store.exists("config.json"):
        store.list("config.json")  # S3: a missing bucket answers a HEAD with a bare 404; a LIST names it
        raise ModelNotFoundError(
            f"model {model} has no config.json: give a Hugging Face checkpoint folder "
            "(`freight demo-model DIR` makes a small one)"
        )
    try:
        config = json.loads(store.get("config.json"))
    except ValueError as exc:
        raise ModelNotFoundError(f"model {model}: config.json is not valid JSON ({exc})") from None
    return config


def _check_tokenizer(store: ObjectStore, model: str) -> None:
    if not store.exists("tokenizer.json"):
        raise ModelNotFoundError(
            f"model {model} has no tokenizer.json: freight needs the fast tokenizer file "
            "(`tokenizer.save_pretrained(DIR)` of a transformers fast tokenizer writes it)"
        )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name == "tokenizer_config.json" and not store.exists(name):
            continue  # optional: chat template and special tokens
        try:
            parsed = json.loads(store.get(name))
        except ValueError as exc:
            raise ModelNotFoundError(f"model {model}: {name} is not valid JSON ({exc})") from None
        if not isinstance(parsed, dict) or (name == "tokenizer.json" and "model" not in parsed):
            raise ModelNotFoundError(f"model {model}: {name} is not a `tokenizers` tokenizer file")


def _check_pooling(store: ObjectStore, model: str, config: dict[str, Any]) -> None:
    try:
        PoolingConfig.parse(lambda name: store.get(name) if store.exists(name) else None, model,
                            int(config["hidden_size"]))  # fmt: skip
    except PoolingConfigError as exc:
        raise ModelNotFoundError(f"--task embed: {exc}") from None


def _weight_files(store: ObjectStore, model: str) -> list[str]:
    if store.exists(INDEX):
        try:
            weight_map = json.loads(store.get(INDEX))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ModelNotFoundError(f"model {model}: {INDEX} has no weight_map of tensor -> file") from None
        missing = [f for f in files if not store.exists(f)]
        if missing:
            raise ModelNotFoundError(
                f"model {model}: {INDEX} lists {', '.join(missing)}, which "
                f"{'is' if len(missing) == 1 else 'are'} missing: the download is incomplete"
            )
        return files
    if store.exists(SINGLE):
        return [SINGLE]
    pickled = store.exists("pytorch_model.bin") or store.exists("pytorch_model.bin.index.json")
    raise ModelNotFoundError(
        f"model {model} has no safetensors weights"
        + (" (only pickle pytorch_model.bin, which freight refuses to load: convert it to "
           "safetensors)" if pickled else f": expected {SINGLE} or {INDEX}")
    )  # fmt: skip


def _header(store: ObjectStore, model: str, name: str) -> dict[str, Any]:
    return read_header(store, f"model {model}", name, ModelNotFoundError)


def read_header(store: ObjectStore, owner: str, name: str, error: type[FreightError]) -> dict[str, Any]:
    """The tensors of one safetensors file ({name: {dtype, shape, data_offsets}}), checked against
    the file's size; `error(message)` raised, the message starting with `owner` ("model M"), when the
    file is not whole safetensors. Layout: u64 little-endian header length N, N bytes of JSON, then
    the data."""
    size = store.size(name)
    where = f"{owner}: {name}"
    redownload = "download it again"
    if size < 8:
        raise error(f"{where} is {size} bytes, too short for safetensors: {redownload}")
    (length,) = struct.unpack("<Q", store.get_range(name, 0, 8))
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise error(
            f"{where} is truncated or not safetensors (its header claims {length:,} bytes, the file "
            f"has {size:,}): {redownload}"
        )
    try:
        header = json.loads(store.get_range(name, 8, length))
    except ValueError:
        raise error(f"{where} has a header that is not JSON: not safetensors; {redownload}") from None
    if not isinstance(header, dict):
        raise error(f"{where} has a header that is not a JSON object: {redownload}")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    data_bytes = size - 8 - length
    end = 0
    for tensor, info in tensors.items():
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise error(f"{where}: tensor {tensor} has a malformed header entry: {redownload}") from None
        if dtype not in KNOWN_DTYPES:
            raise error(
                f"{where}: tensor {tensor} has dtype {dtype[:40]!r}, which freight cannot load (it loads "
                f"{', '.join(sorted(KNOWN_DTYPES))}): convert the checkpoint, or {redownload} if it is damaged"
            )
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= stop or (dtype in DTYPE_BYTES and stop - begin != numel * DTYPE_BYTES[dtype]):
            raise error(
                f"{where}: tensor {tensor} ({dtype} {shape}) has byte range [{begin}, {stop}) that does "
                f"not match its shape: {redownload}"
            )
        end = max(end, stop)
    if end > data_bytes:
        raise error(
            f"{where} is truncated: its header describes {end:,} bytes of tensors, the file holds "
            f"{data_bytes:,}: {redownload}"
        )
    return tensors


def _check_against_config(model: str, config: dict[str, Any], headers: dict[str, dict[str, Any]]) -> None:
    """Cheap agreement of weights and config (the engine checks every tensor's shape at load)."""
    tensors = {t: info for h in headers.values() for t, info in h.items()}
    if not tensors:
        raise ModelNotFoundError(f"model {model}: the safetensors files hold no tensors")
    embed = tensors.get("model.embed_tokens.weight")
    want = [config["vocab_size"], config["hidden_size"]]
    if embed is not None and [int(d) for d in embed["shape"]] != want:
        raise ModelNotFoundError(
            f"model {model}: model.embed_tokens.weight is {list(embed['shape'])} but config.json says "
            f"vocab_size x hidden_size = {want}: the weights and config.json are of different models"
        )
    stored = sum(_numel(info["shape"]) for info in tensors.values())
    implied = _implied_parameters(config)
    if implied > PACKING_MAX * stored + (1 << 20):
        raise ModelNotFoundError(
            f"model {model}: config.json implies {implied:,} parameters, the weights hold {stored:,} values: "
            "config.json (hidden_size, intermediate_size, num_hidden_layers, vocab_size) and the weights "
            "are of different models"
        )
    layers = {int(m.group(1)) for t in tensors if (m := _LAYER.match(t))}
    if layers and len(layers) != config["num_hidden_layers"]:
        raise ModelNotFoundError(
            f"model {model}: the weights hold {len(layers)} decoder layers, config.json says "
            f"num_hidden_layers = {config['num_hidden_layers']}: the weights and config.json are of "
            "different models"
        )


def _numel(shape: Any) -> int:
    numel = 1
    for d in shape:
        numel *= int(d)
    return numel


def _implied_parameters(config: dict[str, Any]) -> int:
    """A lower bound of a decoder's parameters from config.json: the embedding and, per layer, the
    attention projections and one dense MLP (experts counted once)."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or hidden // max(1, heads))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        inter = int(config.get("intermediate_size") or 0)
    except (KeyError, TypeError, ValueError):  # shapes the architecture's own rules judge
        return 0
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    return int(config["vocab_size"]) * hidden + layers * (attention + 3 * hidden * inter)
