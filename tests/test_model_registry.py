"""Adding a decoder architecture is one register() call: a toy architecture defined
here loads from a GGUF (written by the gguf package) and from a Hugging Face folder
(config.json + safetensors), through the same load_model the real models use, and
its logits match numpy on the weights the test wrote."""
import json

import numpy as np
import pytest

import tallow
from tallow import functional as F
from tallow.errors import Error, UnsupportedError
from tallow.models import architectures
from tallow.models.architectures import Architecture, register
from tallow.models.causal_lm import CausalLM
from tallow.nn import Embedding, Linear, Module

import gguf_files

VOCAB, HIDDEN, LAYERS = 11, 8, 2


class ToyBlock(Module):
    def __init__(self, vb, cfg):
        self.mix = Linear(vb.pp("mix"), cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x, step, kv_cache):
        return x + self.mix(x)


class ToyLM(CausalLM):
    """Embedding, residual linear blocks, a head scaled by the toy's own config field."""

    def __init__(self, vb, cfg):
        super().__init__(cfg, vb.device, vb.dtype)
        self.embed_tokens = Embedding(vb.pp("model.embed_tokens"), cfg.vocab_size, cfg.hidden_size)
        self.layers = [ToyBlock(vb.pp(f"model.layers.{i}"), cfg) for i in range(cfg.num_layers)]
        self.head = vb.get((cfg.vocab_size, cfg.hidden_size), "lm_head.weight")
        self.scale = cfg.fields.float("logit_scale", 1.0, positive=True)
        self._finish_init()

    def embed(self, ids):
        return self.embed_tokens(ids)

    def final_norm(self, hidden):
        return hidden

    def lm_head(self, hidden):
        return F.linear(hidden, self.head) * self.scale


@pytest.fixture
def toy():
    arch = register(Architecture(
        "toy", ToyLM, config_defaults={"max_position_embeddings": 77}, gguf_arch="toyarch",
        gguf_blocks={"ffn_mix": "mix"}, gguf_config=lambda g, cfg: {"logit_scale": g.float("logit_scale")}))
    yield arch
    architectures.unregister("toy")


@pytest.fixture
def weights():
    rng = np.random.default_rng(7)
    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)),
         "lm_head.weight": rng.standard_normal((VOCAB, HIDDEN))}
    for i in range(LAYERS):
        w[f"model.layers.{i}.mix.weight"] = rng.standard_normal((HIDDEN, HIDDEN)) * 0.3
    return {k: v.astype(np.float32) for k, v in w.items()}


def _expected(weights, ids, scale):
    h = weights["model.embed_tokens.weight"][ids]
    for i in range(LAYERS):
        h = h + h @ weights[f"model.layers.{i}.mix.weight"].T
    return scale * (h @ weights["lm_head.weight"].T)


def _write_hf(folder, weights):
    save_file = pytest.importorskip("safetensors.numpy").save_file
    folder.mkdir()
    config = {"model_type": "toy", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
              "num_attention_heads": 2, "logit_scale": 0.5}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def _write_gguf(path, weights):
    pytest.importorskip("gguf")

    def metadata(writer):
        writer.add_block_count(LAYERS)
        writer.add_embedding_length(HIDDEN)
        writer.add_head_count(2)
        writer.add_context_length(64)
        writer.add_float32("toyarch.logit_scale", 2.0)
    names = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight"}
    return gguf_files.write(path, "toyarch", metadata,
                            [(names.get(name) or f"blk.{name.split('.')[2]}.ffn_mix.weight", w)
                             for name, w in weights.items()])


def test_a_registered_toy_loads_from_a_hugging_face_folder(toy, weights, tmp_path):
    model = tallow.load_model(_write_hf(tmp_path / "toy", weights), device="cpu")
    ids = [3, 1, 4, 1, 5]
    assert isinstance(model, ToyLM) and model.context_window == 77  # the architecture's default
    np.testing.assert_allclose(model(ids).numpy()[0], _expected(weights, ids, 0.5), rtol=1e-5, atol=1e-5)


def test_a_registered_toy_loads_from_gguf(toy, weights, tmp_path):
    model = tallow.load_model(_write_gguf(tmp_path / "toy.gguf", weights), device="cpu")
    ids = [2, 7, 1, 8]
    assert isinstance(model, ToyLM) and model.context_window == 64  # GGUF context_length
    np.testing.assert_allclose(model(ids).numpy()[0], _expected(weights, ids, 2.0), rtol=1e-5, atol=1e-5)


def test_unregistered_toy_is_a_clear_error_and_double_registration_is_refused(toy, weights, tmp_path):
    folder, gguf_path = _write_hf(tmp_path / "toy", weights), _write_gguf(tmp_path / "toy.gguf", weights)
    with pytest.raises(Error, match="already registered"):
        register(Architecture("toy", CausalLM))
    architectures.unregister("toy")
    with pytest.raises(UnsupportedError, match="model_type 'toy' is not supported"):
        tallow.load_model(folder)
    with pytest.raises(UnsupportedError, match="GGUF architecture 'toyarch' is not supported"):
        tallow.load_model(gguf_path)


def test_builtin_architectures_are_registered_by_their_own_files():
    where = {name: arch.model_class.__module__ for name, arch in architectures.known().items()}
    assert where == {"llama": "tallow.models.decoders.llama", "qwen2": "tallow.models.decoders.llama",
                     "qwen3": "tallow.models.decoders.llama", "phi": "tallow.models.decoders.phi",
                     "phi3": "tallow.models.decoders.phi3", "gemma3_text": "tallow.models.decoders.gemma3"}
