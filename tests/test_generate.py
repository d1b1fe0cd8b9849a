"""Generation: the sampler against transformers' logits processors, stop
strings, streaming, prefix reuse, and `tallow generate` / `tallow chat`, on a
tiny random Llama with a small byte-level BPE tokenizer trained here."""
import io
import json

import numpy as np
import pytest

import tallow
from tallow.generation import Sampler, StopText, chat_prompt_ids, generate_ids
from tiny_llama import save_tiny_llama

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
        "to be or not to be, that is the question", "all that glitters is not gold"] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random Llama (transformers) saved with a trained byte-level BPE tokenizer and a chat template."""
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path, TEXT)
    return path


@pytest.fixture
def model(model_dir):
    return tallow.load_model(model_dir)


# ---- sampler vs transformers' processors ------------------------------------------------------------

def _kept_by_transformers(logits, warper):
    scores = warper(torch.zeros(1, 1, dtype=torch.long), torch.tensor([logits]))
    return sorted(int(i) for i in torch.nonzero(torch.isfinite(scores[0])).flatten())


@pytest.mark.parametrize("top_k,top_p,min_p", [(5, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.1), (20, 0.8, 0.05),
                                               (0, 0.3, 0.0)])
def test_filters_keep_what_transformers_keeps(top_k, top_p, min_p):
    from transformers.generation import logits_process as lp
    rng = np.random.default_rng(top_k + int(100 * top_p))
    for _ in range(5):
        logits = (rng.standard_normal(300) * 3).astype(np.float32)
        warpers = []
        if top_k:
            warpers.append(lp.TopKLogitsWarper(top_k))
        if top_p < 1:
            warpers.append(lp.TopPLogitsWarper(top_p))
        if min_p:
            warpers.append(lp.MinPLogitsWarper(min_p))
        want = logits.copy()
        for w in warpers:
            want = w(torch.zeros(1, 1, dtype=torch.long), torch.tensor(want)[None])[0].numpy()
        want = sorted(int(i) for i in np.nonzero(np.isfinite(want))[0])
        probs = tallow.tensor(logits).softmax(-1).tolist()
        got = sorted(Sampler(1.0, top_k, top_p, min_p).candidates(probs))
        assert got == want


def test_repetition_penalty_matches_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    logits = np.random.default_rng(0).standard_normal(50).astype(np.float32)
    seen = [3, 7, 7, 20, 41]
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([seen]), torch.from_numpy(logits[None]))[0].numpy()
    got = Sampler(repetition_penalty=1.3).penalise(tallow.tensor(logits), seen).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_sampling_follows_the_softmax_and_is_seeded():
    logits = [2.0, 1.0, 0.5, -1.0, 0.0]
    t = tallow.tensor(logits)
    tallow.manual_seed(123)
    draws = [Sampler(temperature=0.7)(t) for _ in range(4000)]
    want = torch.softmax(torch.tensor(logits) / 0.7, -1).numpy()
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert np.abs(freq - want).max() < 0.03  # 4000 draws: the standard error is below 0.008
    tallow.manual_seed(123)
    assert [Sampler(temperature=0.7)(t) for _ in range(4000)] == draws
    assert Sampler()(t) == 0 and Sampler(1.0, top_k=1)(t) == 0
    with pytest.raises(ValueError):
        Sampler(top_p=0.0)


# ---- stop strings --------------------------------------------------------------------------------------

def test_stop_text_holds_back_and_cuts():
    s = StopText(["END", "\n\n"])
    out = [s.feed(p) for p in ["Hello E", "N", "o", " wor", "ld\n", "\nmore"]]
    assert "".join(out) == "Hello ENo world" and s.stopped
    assert out[0] == "Hello " and out[1] == ""  # "EN" could still become "END"
    s = StopText(["END"])
    assert s.feed("abcE") == "abc" and s.finish() == "E"  # no stop came: the held text is released
    s = StopText(["stop"])
    assert s.feed("xx sto") == "xx " and s.feed("p and more") == "" and s.stopped


# ---- generation end to end --------------------------------------------------------------------------------

def test_greedy_matches_transformers_generate(model_dir, model):
    ref = tf.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = model.tokenizer.encode("the quick brown fox")
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    assert list(generate_ids(model, ids, max_tokens=12, stop_tokens=[])) == want


def test_stream_pieces_join_to_the_decoded_tokens(model):
    s = model.stream("to be or not", max_tokens=15, stop_tokens=[])
    pieces = list(s)
    assert len(s.token_ids) == 15 and s.finish_reason == "length"
    assert "".join(pieces) == model.tokenizer.decode(s.token_ids)
    assert s.prompt_tokens == len(model.tokenizer.encode("to be or not"))
    assert s.prefill_seconds > 0 and s.decode_tokens_per_second > 0


def test_stop_strings_and_tokens_end_generation(model):
    full = model.generate("a stitch", max_tokens=15, stop_tokens=[])
    assert len(full) > 4
    cut = full[2:4]
    assert model.generate("a stitch", max_tokens=15, stop_tokens=[], stop=[cut]) == full[:full.index(cut)]
    first = list(generate_ids(model, model.tokenizer.encode("a stitch"), max_tokens=15, stop_tokens=[]))
    stopped = model.stream("a stitch", max_tokens=15, stop_tokens=[first[3]])
    text = stopped.text()
    assert stopped.token_ids == first[:first.index(first[3])] and stopped.finish_reason == "stop"
    assert text == model.tokenizer.decode(stopped.token_ids)


def test_seeded_sampling_is_reproducible(model):
    a = model.generate("the lazy", max_tokens=10, temperature=1.0, top_p=0.9, seed=7, stop_tokens=[])
    b = model.generate("the lazy", max_tokens=10, temperature=1.0, top_p=0.9, seed=7, stop_tokens=[])
    assert a == b


def test_reusing_the_cached_prefix_gives_the_same_tokens(model_dir, model):
    first = chat_prompt_ids(model, [{"role": "user", "content": "the quick"}])
    model.generate(first, max_tokens=5)
    longer = chat_prompt_ids(model, [{"role": "user", "content": "the quick"}, {"role": "assistant", "content": "fox"},
                                     {"role": "user", "content": "all that"}])
    assert longer[:len(first)] == first
    stream = model.stream(longer, max_tokens=10, stop_tokens=[])
    stream.text()
    warm = stream.token_ids
    assert stream.cached_tokens >= len(first)  # only the new turn was prefilled
    assert model.cache.length >= len(longer)
    fresh = tallow.load_model(model_dir)
    assert list(generate_ids(fresh, longer, max_tokens=10, stop_tokens=[])) == warm


def test_chat_renders_the_template(model):
    ids = chat_prompt_ids(model, [{"role": "user", "content": "hi"}])
    assert model.tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    reply = model.chat([{"role": "user", "content": "hi"}], max_tokens=8)
    assert isinstance(reply, str)
    assert model.eos_token_ids == [model.tokenizer.token_to_id("<|im_end|>")]


# ---- the command line ---------------------------------------------------------------------------------------

def test_cli_generate_streams_and_reports(model_dir, capsys):
    from tallow.cli import main
    assert main(["generate", "the quick", "--raw", "--model", str(model_dir), "--max-tokens", "6", "--seed", "1",
                 "--temperature", "0.8"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "tokens," in err and "tok/s (prefill" in err


def test_cli_chat_keeps_history_until_exit(model_dir, monkeypatch, capsys):
    from tallow.cli import chat as cli_chat
    import argparse
    parser = argparse.ArgumentParser()
    cli_chat.add_arguments(parser)
    args = parser.parse_args(["--model", str(model_dir), "--max-tokens", "4", "--stats"])
    out = io.StringIO()
    assert cli_chat.run(args, stdin=io.StringIO("hello there\nall that\n/exit\nnever read\n"), stdout=out) == 0
    assert out.getvalue().count("\n") == 2  # two replies, then /exit
    assert capsys.readouterr().err.count("tokens,") == 2


def test_cli_reports_a_missing_model(capsys):
    from tallow.cli import main
    assert main(["generate", "hi", "--model", "/no/such/model.gguf"]) == 2
    assert "no-such" not in capsys.readouterr().out


def test_cli_corrupt_chat_template_is_one_line(model_dir, tmp_path, capsys):
    import shutil
    from tallow.cli import main
    broken = tmp_path / "broken-template"
    shutil.copytree(model_dir, broken)
    config = json.loads((broken / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }"  # unclosed tag and loop
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["generate", "hi", "--model", str(broken), "--max-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith("tallow generate: error:") and "chat template" in err


def test_bad_prompt_ids_are_refused_before_the_cache(model):
    """A negative id used to wrap to the last row of the embedding; now each bad id is named."""
    vocab = model.config.vocab_size
    for ids, match in (([5, -1], r"prompt token id -1 is outside the vocabulary \(0 to %d\)" % (vocab - 1)),
                       ([vocab], r"prompt token id %d is outside" % vocab)):
        with pytest.raises(tallow.IndexRangeError, match=match):
            list(generate_ids(model, ids, max_tokens=2))
        with pytest.raises(tallow.IndexRangeError):
            model.generate(ids, max_tokens=2)
    for ids in ([1.5], ["a"], 7):
        with pytest.raises(tallow.DTypeError, match="token ids|list of token ids"):
            list(generate_ids(model, ids, max_tokens=2))
    with pytest.raises(tallow.IndexRangeError, match=r"embedding: id -1 is out of range"):
        model([[3, -1]])  # the forward pass itself, too
    assert len(list(generate_ids(model, [5, 6], max_tokens=2))) <= 2  # and the model still works
