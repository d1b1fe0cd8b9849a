"""Bounded tokenizer work on hostile input (issue 29, probing round 2):
backtracking regexes in a tokenizer.json, huge prompts, a stream of broken
UTF-8, and long chats. Each is either one tallow error line or work bounded by
counts and sizes (no wall-clock assertions; timeouts only guard against hangs)."""
import copy
import json
import os
import subprocess
import sys
import tracemalloc

import pytest

from tallow.errors import ContextWindowError, FormatError
from tallow.tokenizer import Tokenizer
from tallow.tokenizer.byte_level import GPT2_PATTERN
from tallow.tokenizer.gguf_vocab import _LLAMA3_PATTERN, _QWEN2_PATTERN
from tallow.tokenizer.regex_safety import check

tokenizers = pytest.importorskip("tokenizers")
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "data", "tokenizer_corpus.txt"), encoding="utf-8", newline="") as _f:
    CORPUS = _f.read()


@pytest.fixture(scope="module")
def small_spec():
    """A byte-level BPE trained here, with ChatML's special tokens (no model files needed)."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                             "<|im_end|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.split("\n"), trainer)
    return json.loads(tok.to_str())


def _with_regex(spec, where, pattern):
    spec = copy.deepcopy(spec)
    regex = {"Regex": pattern}
    if where == "pre_tokenizer":
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": regex, "behavior": "Isolated", "invert": False}, spec["pre_tokenizer"]]}
    elif where == "normalizer":
        spec["normalizer"] = {"type": "Replace", "pattern": regex, "content": "b"}
    else:
        spec["decoder"] = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": regex, "content": "b"},
                                                            spec["decoder"]]}
    return spec


# ---- regexes that backtrack ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["python", "tokenizers"])
@pytest.mark.parametrize("where", ["pre_tokenizer", "normalizer", "decoder"])
@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a|a)*$", r"(a|ab)*c", r"(\p{L}{1,3})+x", r"a*a*a*a*a*a*\d"])
def test_backtracking_regexes_are_refused_at_load(small_spec, backend, where, pattern):
    """Before: the pure-Python tokenizer hung (killed after 60 s) on (a+)+$ against "aaaa...b",
    and the library raised pyo3_runtime.PanicException (a traceback from the CLI)."""
    with pytest.raises(FormatError, match=r"tokenizer.json: .*can backtrack without bound"):
        Tokenizer.from_dict(_with_regex(small_spec, where, pattern), backend=backend)


def test_real_tokenizer_patterns_pass_the_check():
    deepseek = (r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓ]+|\s?[!-/:-~！-／：-～‘-‟　-。]+|\s+$|[一-龥ࠀ-一가-퟿]+|\p{N}+")
    for pattern in (GPT2_PATTERN, _LLAMA3_PATTERN, _QWEN2_PATTERN, deepseek, r"(?:\r\n|\n)+", r"(\w|\d)+",
                    r"\s*[\r\n]+", r"(ab){2}"):
        check(pattern)


def test_a_library_panic_is_one_format_error(small_spec):
    """A pattern the load-time check lets through, on which Oniguruma gives up: the
    PanicException (a BaseException) becomes a FormatError naming the file."""
    spec = _with_regex(small_spec, "pre_tokenizer", r"(a*a*a*a*a*a*)\d")
    tok = Tokenizer.from_dict(spec, backend="tokenizers", source="hostile/tokenizer.json")
    with pytest.raises(FormatError, match="hostile/tokenizer.json: the tokenizers library failed encoding"):
        tok.encode("a" * 3000 + "b1")


def test_cli_says_one_line_for_a_backtracking_tokenizer(tmp_path, small_spec):
    """`tallow generate` with such a tokenizer.json: one error line, exit 2 (in a child process)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, HERE)
    from tiny_llama import save_tiny_llama
    save_tiny_llama(tmp_path, CORPUS.split("\n")[:50], max_position_embeddings=64)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    (tmp_path / "tokenizer.json").write_text(json.dumps(_with_regex(spec, "pre_tokenizer", r"(a+)+$")))
    env = dict(os.environ, RUST_BACKTRACE="0")
    run = subprocess.run([sys.executable, "-m", "tallow", "generate", "--model", str(tmp_path), "--max-tokens", "2",
                          "a" * 40 + "b"], env=env, capture_output=True, text=True, timeout=300)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert "tokenizer.json" in lines[0] and "backtrack without bound" in lines[0]


# ---- huge prompts -------------------------------------------------------------------------------

class _CountingModel:
    """Counts the pre-tokens the pure-Python BPE model is asked to tokenize."""

    def __init__(self, model):
        self.model, self.words = model, 0

    def tokenize(self, word):
        self.words += 1
        return self.model.tokenize(word)

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.mark.slow  # tokenizes 600k characters twice under tracemalloc
def test_python_tokenizer_memory_is_linear_and_small(small_spec):
    """A long text and one huge word: the peak stays a few dozen bytes a character (it was
    ~200 for a long word: ~2 GB for 10 MB), and the ids equal the library's."""
    ours, lib = Tokenizer.from_dict(small_spec, backend="python"), Tokenizer.from_dict(small_spec, backend="tokenizers")
    for text in ((CORPUS * 3)[:400_000], "a" * 200_000):
        ours.encode(text[:1000])
        tracemalloc.start()
        try:
            ids = ours.encode(text)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ids == lib.encode(text)
        assert peak < 80 * len(text), (len(text), peak)


@pytest.mark.parametrize("text", [(CORPUS * 20)[:2_000_000], "a" * 2_000_000])
def test_encode_with_a_limit_stops_soon_after_it(small_spec, text):
    """Both backends answer "more than the limit" without tokenizing the whole text; the
    pure-Python one tokenizes only a few more pre-tokens than the limit takes."""
    ours = Tokenizer.from_dict(small_spec, backend="python")
    counting = ours._impl.model = _CountingModel(ours._impl.model)
    lib = Tokenizer.from_dict(small_spec, backend="tokenizers")
    assert ours.encode(text, limit=1000) is None and lib.encode(text, limit=1000) is None
    assert counting.words <= 1001
    short = text[:3000]
    for tok in (ours, lib):
        want = tok.encode(short)
        assert tok.encode(short, limit=len(want)) == want
        assert tok.encode(short, limit=len(want) - 1) is None


def test_generate_refuses_a_huge_prompt_without_tokenizing_it_all(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, HERE)
    import tallow
    from tiny_llama import save_tiny_llama
    save_tiny_llama(tmp_path, CORPUS.split("\n")[:50], max_position_embeddings=64)
    model = tallow.load_model(tmp_path)
    calls = []
    encode = model.tokenizer._impl.encode
    model.tokenizer._impl.encode = lambda text, special, limit: calls.append(limit) or encode(text, special, limit)
    with pytest.raises(ContextWindowError, match="more than 63 tokens .* context window of 64"):
        model.generate("the quick brown fox " * 500_000, max_tokens=2)
    assert calls == [63]
    with pytest.raises(ContextWindowError, match="more than 63 tokens"):
        model.chat([{"role": "user", "content": "the quick brown fox " * 1000}], max_tokens=2)


# ---- streaming broken UTF-8 ---------------------------------------------------------------------

def test_stream_decoder_work_is_bounded_on_impossible_utf8(small_spec):
    """A token whose byte can never finish a character, 8,192 times: every U+FFFD comes out
    within 3 steps, and each step decodes a handful of ids (it was all the held ones:
    8,192 steps took 13.6 s and emitted nothing)."""
    for backend in ("python", "tokenizers"):
        tok = Tokenizer.from_dict(small_spec, backend=backend)
        lone = tok.token_to_id("\u0122")  # the byte 0x80: a continuation byte with nothing to continue
        want = tok.decode([lone] * 8192)
        decoded = []

        def counted(ids, skip, real=tok._impl.decode, decoded=decoded):
            decoded.append(len(ids))
            return real(ids, skip)
        tok._impl.decode = counted
        dec = tok.stream_decoder()
        pieces = [dec.step(lone) for _ in range(8192)]
        out = "".join(pieces) + dec.flush()
        assert out == "\ufffd" * 8192 == want
        assert max(decoded) <= 16 and sum(decoded) <= 32 * 8192
        emitted = 0
        for k, piece in enumerate(pieces, 1):
            emitted += len(piece)
            assert emitted >= k - 3  # at most 3 ids wait: a character has at most 4 bytes
        # an unfinished character still waits for its last byte: "€" is e2 82 ac
        tail = [tok.token_to_id(c) for c in ("\u00e2", "\u0124", "\u00ac")]
        dec = tok.stream_decoder()
        assert [dec.step(i) for i in tail] == ["", "", "\u20ac"]


# ---- long chats ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["python", "tokenizers"])
def test_encode_reusing_equals_encode_and_tokenizes_only_new_pieces(small_spec, backend):
    tok = Tokenizer.from_dict(small_spec, backend=backend,
                              config={"chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                                                       "{{ m['content'] }}<|im_end|>\n{% endfor %}"})
    pytest.importorskip("jinja2")
    lines = [line for line in CORPUS.split("\n") if line][:120]
    messages = []
    for i, line in enumerate(lines):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": line})
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert tok.encode_reusing(text) == tok.encode(text, add_special_tokens=False)
    encoded = []
    real = tok._impl.encode
    tok._impl.encode = lambda text, special, limit: encoded.append(len(text)) or real(text, special, limit)
    text = tok.apply_chat_template(messages + [{"role": "user", "content": "one more line"}])
    assert tok.encode_reusing(text) == real(text, False, None)
    if backend == "tokenizers":
        assert sum(encoded) < 100  # the new message and the generation prompt, not the history
    assert tok.encode_reusing(text, limit=10) is None


def test_drop_oldest_tries_few_histories(tmp_path):
    """2,000 turns into a 64-position window: a few renders, not one per dropped turn."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, HERE)
    import tallow
    from tallow.generation import chat_prompt_ids, fit_history
    from tiny_llama import save_tiny_llama
    save_tiny_llama(tmp_path, CORPUS.split("\n")[:50], max_position_embeddings=64)
    model = tallow.load_model(tmp_path)
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(2000):
        messages += [{"role": "user", "content": f"fox {i}"}, {"role": "assistant", "content": "a dog"}]
    messages.append({"role": "user", "content": "the end"})
    renders = []
    real = model.tokenizer.apply_chat_template
    model.tokenizer.apply_chat_template = lambda ms, **kw: renders.append(len(ms)) or real(ms, **kw)
    kept, ids = fit_history(model, messages, max_tokens=8)
    assert len(renders) <= 30
    assert kept[0] == messages[0] and kept[1:] == messages[len(messages) - len(kept) + 1:] and kept[1]["role"] == "user"
    assert ids == chat_prompt_ids(model, kept) and len(ids) + 8 <= 64
    longer = messages[:1] + messages[len(messages) - len(kept) - 1:]
    assert len(chat_prompt_ids(model, longer)) + 8 > 64  # one more turn would not fit
