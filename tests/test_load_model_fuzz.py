"""tallow.load_model on hostile and careless files: bad config.json values and GGUF
metadata are FormatErrors naming the file and key, never a ZeroDivisionError,
IndexError, TypeError or RecursionError from deep inside. The issue's cases by
name, then a bounded, seeded fuzz over mutated copies of the real SmolLM2 GGUF
and of a small safetensors + config.json folder."""
import json
import math
import struct

import numpy as np
import pytest

import tallow
import tallow.io as tio
from tallow.errors import Error, FormatError
from tallow.io.gguf import write_gguf
from tallow.io.safetensors import write_safetensors

import gguf_files

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

EMBD_ROWS = 1024  # the trimmed copy keeps this many rows of token_embd


# -- the inputs: a trimmed real GGUF and a tiny HF folder ---------------------------------

@pytest.fixture(scope="module")
def smollm2_parts(smollm2_gguf):
    """(metadata, metadata types, tensors) of SmolLM2 cut to its first block and the first
    EMBD_ROWS rows of token_embd: the real header and tokenizer, loadable in a few ms."""
    f = tio.open(str(smollm2_gguf))
    meta, types = dict(f.metadata), dict(f.metadata_types)
    meta["llama.block_count"] = 1
    tensors = {}
    for name in f.keys():
        if name.startswith("blk.") and not name.startswith("blk.0."):
            continue
        info = f.info(name)
        raw = f.raw(name)
        if name == "token_embd.weight":
            raw = raw[:EMBD_ROWS * (info.nbytes // info.shape[0])]
            shape = (EMBD_ROWS,) + info.shape[1:]
        else:
            shape = info.shape
        tensors[name] = (info.dtype.name, shape, bytes(raw))
    return meta, types, tensors


def _write_gguf(path, parts, **edits):
    """The trimmed SmolLM2 with metadata keys replaced (None deletes); each edited value's
    GGUF type is inferred from the Python value, so a count can become a string or a list."""
    meta, types, tensors = parts
    meta, types = dict(meta), dict(types)
    for key, value in edits.items():
        types.pop(key, None)
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    write_gguf(path, tensors, meta, types)
    return path


TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}


def _tiny_weights():
    rng = np.random.default_rng(0)
    d, f, v, kv = 16, 32, 64, 8
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,),
              "model.layers.0.input_layernorm.weight": (d,), "model.layers.0.post_attention_layernorm.weight": (d,),
              "model.layers.0.self_attn.q_proj.weight": (d, d), "model.layers.0.self_attn.k_proj.weight": (kv, d),
              "model.layers.0.self_attn.v_proj.weight": (kv, d), "model.layers.0.self_attn.o_proj.weight": (d, d),
              "model.layers.0.mlp.gate_proj.weight": (f, d), "model.layers.0.mlp.up_proj.weight": (f, d),
              "model.layers.0.mlp.down_proj.weight": (d, f)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


@pytest.fixture(scope="module")
def tiny_safetensors(tmp_path_factory):
    p = tmp_path_factory.mktemp("tiny") / "model.safetensors"
    write_safetensors(p, _tiny_weights())
    return p.read_bytes()


def _write_folder(folder, config, weights):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def _load_or_tallow_error(path):
    """Load (and, if it loads, build its tokenizer and run one forward); only a tallow Error may come out."""
    try:
        model = tallow.load_model(path, device="cpu")
        _ = model.tokenizer  # (a GGUF's is built on first use)
        model.cache.reset()
        model([[1, 2]])
    except Error as e:
        return e
    return None


# -- the issue's cases, by name ---------------------------------------------------------------

@pytest.mark.parametrize("key,value,match", [
    ("llama.attention.head_count", 0, r"llama\.attention\.head_count = 0: must be an integer in \[1, 576\]"),
    ("llama.attention.head_count", "9", r"llama\.attention\.head_count = '9': must be an integer"),
    ("llama.attention.head_count", [9, 9], r"llama\.attention\.head_count = \[9, 9\]: must be an integer"),
    ("llama.attention.head_count", 15, r"head_count = 15: must be a divisor of embedding_length \(576\)"),
    ("llama.attention.head_count_kv", 2, r"head_count_kv = 2: must be a divisor of attention\.head_count \(9\)"),
    ("llama.embedding_length", 0, r"llama\.embedding_length = 0: must be an integer in \[1, 16777216\]"),
    ("llama.embedding_length", None, r"missing llama\.embedding_length"),
    ("llama.block_count", -1, r"llama\.block_count = -1"),
    ("llama.context_length", 0, r"llama\.context_length = 0"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), r"layer_norm_rms_epsilon = nan: must be a finite"),
    ("llama.attention.layer_norm_rms_epsilon", -0.5, r"layer_norm_rms_epsilon = -0\.5: must be a number > 0"),
    ("llama.rope.freq_base", 0.0, r"llama\.rope\.freq_base = 0\.0: must be a number > 0"),
    ("llama.rope.dimension_count", 65, r"rope\.dimension_count = 65"),
    ("tokenizer.ggml.eos_token_id", 10 ** 6,
     r"tokenizer\.ggml\.eos_token_id = 1000000: must be a token id in \[0, 1024\)"),
    ("tokenizer.ggml.bos_token_id", -1, r"tokenizer\.ggml\.bos_token_id = -1"),
    ("tokenizer.ggml.tokens", [1, 2, 3],
     r"tokenizer\.ggml\.tokens = \[1, 2, 3\]: must be a non-empty array of strings"),
    ("tokenizer.ggml.pre", ["smollm"], r"pre-tokenizer \['smollm'\] is not supported"),
])
def test_gguf_bad_metadata_is_named(tmp_path, smollm2_parts, key, value, match):
    path = _write_gguf(tmp_path / "bad.gguf", smollm2_parts, **{key: value})
    with pytest.raises(Error, match=match) as e:
        tallow.load_model(path, device="cpu")
    assert str(path) in str(e.value)


def test_a_gguf_tokenizer_is_built_on_first_use_and_names_its_errors(tmp_path, smollm2_parts, monkeypatch):
    """load_model leaves the GGUF's tokenizer to its first use (CausalLM.tokenizer): the same
    tokenizer as Tokenizer.from_gguf, built once. Its metadata is still checked at load; what
    only the build finds (a merge naming tokens the vocabulary lacks) is refused, naming the
    file, on every use."""
    from tallow.tokenizer import Tokenizer, tokenizer as tokenizer_module
    path = _write_gguf(tmp_path / "ok.gguf", smollm2_parts)
    text = "The capital of France is Paris."
    want = Tokenizer.from_gguf(str(path)).encode(text)
    built = []
    make = tokenizer_module._make_backend
    monkeypatch.setattr(tokenizer_module, "_make_backend", lambda *a: built.append(1) or make(*a))
    model = tallow.load_model(path, device="cpu")
    assert built == []
    assert model.tokenizer.encode(text) == want
    assert model.tokenizer is model.tokenizer and built == [1]  # once
    with pytest.raises(Error, match="wordpiece"):
        tallow.load_model(_write_gguf(tmp_path / "w.gguf", smollm2_parts, **{"tokenizer.ggml.model": "wordpiece"}),
                          device="cpu")
    bad = _write_gguf(tmp_path / "bad.gguf", smollm2_parts, **{"tokenizer.ggml.merges": ["zzqq xxyy"]})
    model = tallow.load_model(bad, device="cpu")
    for _ in range(2):
        with pytest.raises(Error, match="zzqq") as e:
            _ = model.tokenizer
        assert str(bad) in str(e.value)


def test_gguf_trimmed_copy_loads(tmp_path, smollm2_parts):
    """The fuzz's starting point is a working model (so a refusal below is the mutation's doing)."""
    model = tallow.load_model(_write_gguf(tmp_path / "ok.gguf", smollm2_parts), device="cpu")
    assert model.config.vocab_size == EMBD_ROWS and model.config.num_layers == 1
    assert model([[1, 2]]).shape == (1, 2, EMBD_ROWS)


def test_config_json_nested_1000_deep(tmp_path, tiny_safetensors):
    deep = "[" * 1000 + "]" * 1000
    folder = _write_folder(tmp_path / "m", '{"model_type": "llama", "x": %s}' % deep, tiny_safetensors)
    with pytest.raises(FormatError, match=r"config\.json: JSON nested too deeply"):
        tallow.load_model(folder, device="cpu")
    # deeper than Python's recursion limit, too
    deeper = "{\"a\":" * 100_000 + "1" + "}" * 100_000
    (folder / "config.json").write_text(deeper)
    with pytest.raises(FormatError, match="nested too deeply"):
        tallow.load_model(folder, device="cpu")


@pytest.mark.parametrize("key,value,match", [
    ("num_attention_heads", 0, r"num_attention_heads = 0: must be an integer in \[1, 16\]"),
    ("num_attention_heads", "2", r"num_attention_heads = '2': must be an integer"),
    ("num_attention_heads", 3, r"num_attention_heads = 3: must be a divisor of hidden_size \(16\)"),
    ("hidden_size", 0, r"hidden_size = 0: must be an integer"),
    ("hidden_size", [16], r"hidden_size = \[16\]: must be an integer"),
    ("vocab_size", None, r"missing vocab_size"),
    ("eos_token_id", 64, r"eos_token_id = 64: must be token ids in \[0, 64\)"),
    ("eos_token_id", [2, -1], r"eos_token_id = \[2, -1\]"),
    ("rms_norm_eps", "1e-6", r"rms_norm_eps = '1e-6': must be a finite number"),
    ("rope_theta", -1.0, r"rope_theta = -1\.0: must be a number > 0"),
    ("rope_scaling", {"rope_type": "linear"}, r"missing rope_scaling\.factor"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                      "original_max_position_embeddings": 16}, r"high_freq_factor = 1\.0: must be different"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, r"rope type 'yarn' is not supported"),
    ("partial_rotary_factor", 2.0, r"partial_rotary_factor = 2\.0: must be a number in \[0\.0, 1\.0\]"),
    ("max_position_embeddings", -5, r"max_position_embeddings = -5"),
    ("tie_word_embeddings", "yes", r"tie_word_embeddings = 'yes': must be true or false"),
])
def test_config_json_bad_values_are_named(tmp_path, tiny_safetensors, key, value, match):
    folder = _write_folder(tmp_path / "m", {**TINY, key: value} if value is not None else
                           {k: v for k, v in TINY.items() if k != key}, tiny_safetensors)
    with pytest.raises(Error, match=match) as e:
        tallow.load_model(folder, device="cpu")
    assert str(folder / "config.json") in str(e.value)


def test_generation_config_eos_outside_vocab(tmp_path, tiny_safetensors):
    folder = _write_folder(tmp_path / "m", TINY, tiny_safetensors)
    assert _load_or_tallow_error(folder) is None
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 99]}))
    with pytest.raises(FormatError, match=r"generation_config\.json: eos_token_id = \[2, 99\]"):
        tallow.load_model(folder, device="cpu")


def test_safetensors_header_length_off_by_one(tmp_path, tiny_safetensors):
    """N-1 still parses (the header ends in padding) but shifts every weight by a byte:
    refused, as the safetensors library refuses it."""
    st_numpy = pytest.importorskip("safetensors.numpy")
    (n,) = struct.unpack("<Q", tiny_safetensors[:8])
    assert tiny_safetensors[8 + n - 1:8 + n] == b" "  # the case that used to load shifted weights
    shifted = struct.pack("<Q", n - 1) + tiny_safetensors[8:]
    with pytest.raises(Exception, match="incomplete metadata"):
        st_numpy.load(shifted)
    with pytest.raises(FormatError, match="incomplete metadata"):
        tio.open(shifted)
    folder = _write_folder(tmp_path / "m", TINY, shifted)
    with pytest.raises(FormatError, match=r"model\.safetensors: .*incomplete metadata"):
        tallow.load_model(folder, device="cpu")
    with pytest.raises(FormatError, match="incomplete metadata"):
        tio.open(tiny_safetensors + b"\0")  # trailing bytes: the library refuses them too


def test_safetensors_gap_between_tensors(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}
    blob = json.dumps(header).encode()
    data = struct.pack("<Q", len(blob)) + blob + b"\0" * 20
    with pytest.raises(Exception, match="invalid offset"):
        st_numpy.load(data)
    with pytest.raises(FormatError, match=r"'b': data starts at 12 .* end at 8"):
        tio.open(data)


def test_gguf_many_empty_nested_arrays_refused_fast(tmp_path, monkeypatch):
    """The issue's 96 MB file held 8M empty arrays in one array (87 s, 1.76 GB to open);
    the same shape at 100k arrays is refused before any is built."""
    from tallow.io import gguf as gguf_io
    n = 100_000
    path = tmp_path / "arrays.gguf"  # k: an array (9) of n arrays (9), each an empty array of u32 (4)
    path.write_bytes(gguf_files.raw(gguf_files.kv(b"k", 9, struct.pack("<IQ", 9, n) + struct.pack("<IQ", 4, 0) * n), 1))
    values = [0]
    value = gguf_io._Cursor.value

    def counted(cursor, *args, **kwargs):
        values[0] += 1
        return value(cursor, *args, **kwargs)
    monkeypatch.setattr(gguf_io._Cursor, "value", counted)
    with pytest.raises(FormatError, match=r"arrays.gguf: metadata 'k': more than 65536 arrays nested"):
        tallow.load_model(path, device="cpu")
    assert values[0] == 1  # the outer array, none of its items


# -- the fuzz ------------------------------------------------------------------------------------

_NUMERIC_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
                 "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.freq_base",
                 "llama.attention.layer_norm_rms_epsilon", "llama.rope.dimension_count", "llama.attention.key_length",
                 "llama.rope.scaling.type", "llama.rope.scaling.factor", "llama.attention.sliding_window",
                 "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                 "tokenizer.ggml.add_bos_token", "tokenizer.ggml.pre", "tokenizer.ggml.model", "general.architecture",
                 "tokenizer.chat_template", "tokenizer.ggml.token_type"]
_BAD_VALUES = [0, -1, 1, 3, 2 ** 31, 2 ** 40, "x", "linear", [1, 2], [], 0.5, -0.0, math.nan, math.inf, 1e30, True,
               None]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], derandomize=True)
@given(edits=st.dictionaries(st.sampled_from(_NUMERIC_KEYS), st.sampled_from(_BAD_VALUES), min_size=1, max_size=3))
def test_fuzz_gguf_metadata_values(tmp_path, smollm2_parts, edits):
    path = _write_gguf(tmp_path / "fuzz.gguf", smollm2_parts, **edits)
    _load_or_tallow_error(path)


@pytest.fixture(scope="module")
def smollm2_trimmed_bytes(tmp_path_factory, smollm2_parts):
    path = _write_gguf(tmp_path_factory.mktemp("trim") / "t.gguf", smollm2_parts)
    return path.read_bytes(), tio.open(path).data_start


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], derandomize=True)
@given(data=st.data())
def test_fuzz_gguf_header_bytes(tmp_path, smollm2_trimmed_bytes, data):
    """Byte flips in the header region (counts, keys, types, tensor infos) and truncations."""
    blob, header_end = smollm2_trimmed_bytes
    b = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        b[data.draw(st.integers(0, header_end - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.none() | st.integers(0, len(b)))
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(b[:cut]) if cut is not None else bytes(b))
    _load_or_tallow_error(path)


_CONFIG_KEYS = sorted(TINY) + ["head_dim", "rope_scaling", "rope_parameters", "partial_rotary_factor",
                                "sliding_window", "attention_bias", "model_type"]
_CONFIG_VALUES = _BAD_VALUES + [{"rope_type": "linear", "factor": 0}, {"rope_type": "longrope"}, {"x": [1]}, "phi3",
                                {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8}]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], derandomize=True)
@given(edits=st.dictionaries(st.sampled_from(_CONFIG_KEYS), st.sampled_from(_CONFIG_VALUES), min_size=1, max_size=3),
       flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=2),
       length_delta=st.sampled_from([0, 0, 0, -1, 1, -8]))
def test_fuzz_safetensors_folder(tmp_path, tiny_safetensors, edits, flips, length_delta):
    """config.json values mutated, and the safetensors header edited (bytes, header length)."""
    config = {k: v for k, v in {**TINY, **edits}.items() if v is not None}
    b = bytearray(tiny_safetensors)
    (n,) = struct.unpack("<Q", b[:8])
    b[:8] = struct.pack("<Q", max(0, n + length_delta))
    for pos, value in flips:
        b[pos % (8 + n)] = value
    folder = _write_folder(tmp_path / "m", json.dumps(config), bytes(b))
    _load_or_tallow_error(folder)


# -- Whisper folders and tokenizer files --------------------------------------------------------

def _whisper_folder(tmp_path, real, **edits):
    """A copy of the fetched whisper-tiny.en folder `real` (its weights linked) with config edits."""
    folder = tmp_path / "whisper"
    folder.mkdir()
    config = json.loads((real / "config.json").read_text(encoding="utf-8"))
    config.update(edits)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").symlink_to(real / "model.safetensors")
    return folder


@pytest.mark.parametrize("key,value,match", [
    ("d_model", 0, r"d_model = 0: must be an integer in \[1, "),
    ("encoder_attention_heads", 0, r"encoder_attention_heads = 0: must be an integer in \[1, 384\]"),
    ("decoder_attention_heads", 5, r"decoder_attention_heads = 5: must be a divisor of d_model \(384\)"),
    ("vocab_size", "51864", r"vocab_size = '51864': must be an integer"),
    ("eos_token_id", 60000, r"eos_token_id = 60000: must be a token id in \[0, 51864\)"),
    ("suppress_tokens", [1, -2], r"suppress_tokens = \[1, -2\]: must be a list of token ids"),
    ("activation_function", "swish", r"activation_function = 'swish': must be one of"),
])
def test_whisper_config_bad_values_are_named(tmp_path, whisper_tiny_dir, key, value, match):
    folder = _whisper_folder(tmp_path, whisper_tiny_dir, **{key: value})
    with pytest.raises(FormatError, match=match) as e:
        tallow.load_model(folder, device="cpu")
    assert str(folder / "config.json") in str(e.value)


def test_tokenizer_json_nested_too_deep(tmp_path):
    from tallow.tokenizer import Tokenizer
    p = tmp_path / "tokenizer.json"
    p.write_text('{"model": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(FormatError, match=r"tokenizer\.json: JSON nested too deeply"):
        Tokenizer.from_file(p)


def _cut_vocabulary(parts, keep):
    """The trimmed SmolLM2 with its vocabulary cut to the first `keep` tokens (and the merges
    among them), a tokenizer that still loads and encodes."""
    meta, types, tensors = parts
    tokens = meta["tokenizer.ggml.tokens"][:keep]
    known = set(tokens)
    merges = [m for m in meta["tokenizer.ggml.merges"] if "".join(m.split(" ")) in known
              and all(p in known for p in m.split(" "))]
    return ({**meta, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": meta["tokenizer.ggml.token_type"][:keep],
             "tokenizer.ggml.merges": merges}, types, tensors)


def test_gguf_vocabulary_shorter_than_the_embedding_is_refused_at_load(tmp_path, smollm2_parts):
    """The model could produce ids the vocabulary cannot decode: refused when loading, naming the
    file, instead of "token id 8318 is outside the vocabulary" mid-generation."""
    path = _write_gguf(tmp_path / "short.gguf", _cut_vocabulary(smollm2_parts, 500))
    with pytest.raises(FormatError, match=rf"{path}: tokenizer\.ggml\.tokens holds 500 tokens but token_embd\.weight "
                                          rf"has {EMBD_ROWS} rows"):
        tallow.load_model(path, device="cpu")
    from tallow.tokenizer import Tokenizer
    assert Tokenizer.from_gguf(tio.open(str(path))).encode("hello") != []  # the refusal is the check's, not the tokenizer's
    # as long as the embedding (and no output head): loads
    model = tallow.load_model(_write_gguf(tmp_path / "even.gguf", _cut_vocabulary(smollm2_parts, EMBD_ROWS)),
                              device="cpu")
    assert model.config.vocab_size == EMBD_ROWS


def test_gguf_output_head_longer_than_the_vocabulary_is_refused_at_load(tmp_path, smollm2_parts, capsys):
    meta, types, tensors = _cut_vocabulary(smollm2_parts, EMBD_ROWS)
    dtype, shape, raw = tensors["token_embd.weight"]
    head = (dtype, (2 * EMBD_ROWS,) + shape[1:], raw * 2)  # an untied output head with twice the rows
    path = _write_gguf(tmp_path / "head.gguf", (meta, types, {**tensors, "output.weight": head}))
    with pytest.raises(FormatError, match=rf"{path}: tokenizer\.ggml\.tokens holds {EMBD_ROWS} tokens but "
                                          rf"output\.weight has {2 * EMBD_ROWS} rows"):
        tallow.load_model(path, device="cpu")
    from tallow.cli import main as cli_main
    assert cli_main(["generate", "--model", str(path), "--max-tokens", "2", "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "output.weight has 2048 rows" in err
