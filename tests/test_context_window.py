"""The context window: a prompt that does not fit fails before any compute with
ContextWindowError, a generation that fills it stops with finish_reason
"context", and chat's opt-in "drop_oldest" history policy (`tallow chat
--drop-oldest-turns`) keeps a long conversation going. A random Llama with 48
positions and a small trained BPE tokenizer; the real SmolLM2 GGUF for the
default window read from its metadata."""
import argparse
import io

import pytest

import tallow
from tallow.errors import ContextWindowError
from tallow.generation import chat_prompt_ids, generate_ids
from tiny_llama import save_tiny_llama

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

WINDOW = 48
TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine", "all that glitters is not gold",
        "system\nuser\nassistant\n", "fox 0 fox 1 fox 2 fox 3 fox 4 fox 5 fox 6 fox 7 fox 8 fox 9"] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-window")
    save_tiny_llama(path, TEXT, max_position_embeddings=WINDOW)
    return path


@pytest.fixture
def model(model_dir):
    return tallow.load_model(model_dir)


def test_forward_refuses_positions_past_the_window(model):
    assert model.context_window == WINDOW
    with pytest.raises(ContextWindowError, match=f"context window of {WINDOW}"):
        model(list(range(3, 3 + WINDOW + 1)))
    assert model.cache.length == 0  # refused before computing
    model(list(range(3, 3 + WINDOW - 2)))
    with pytest.raises(ContextWindowError, match=f"{WINDOW - 2} cached \\+ 3 new"):
        model([5, 6, 7])
    assert model([5, 6]).shape == (1, 2, model.config.vocab_size)


def test_a_prompt_that_fills_the_window_fails_at_the_call(model):
    with pytest.raises(ContextWindowError) as err:
        generate_ids(model, [7] * WINDOW, max_tokens=4)  # raised here, not at the first next()
    message = str(err.value)
    assert f"{WINDOW} tokens" in message and f"context window of {WINDOW}" in message and "drop_oldest" in message
    with pytest.raises(ContextWindowError):
        model.stream([7] * (WINDOW + 8), max_tokens=4)
    with pytest.raises(ContextWindowError):
        model.chat([{"role": "user", "content": "the quick brown fox " * 20}], max_tokens=4)


def test_generation_that_fills_the_window_stops_with_finish_reason_context(model_dir, model):
    prompt = model.tokenizer.encode("the quick brown fox jumps over the lazy dog "
                                    "a stitch in time saves nine all that glitters")
    room = WINDOW - len(prompt)
    assert 0 < room <= 12
    stream = model.stream(prompt, max_tokens=50, stop_tokens=[])
    stream.text()
    assert stream.finish_reason == "context" and len(stream.token_ids) == room
    ref = tf.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            max_new_tokens=room, do_sample=False)[0, len(prompt):].tolist()
    assert stream.token_ids == want  # the tokens before the stop are the reference's
    short = model.stream(prompt, max_tokens=2, stop_tokens=[])
    short.text()
    assert short.finish_reason == "length"


def _conversation(turns):
    messages = [{"role": "system", "content": "all"}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"fox {i}"}, {"role": "assistant", "content": "a"}]
    return messages + [{"role": "user", "content": "dog"}]


def test_drop_oldest_keeps_the_system_message_and_the_latest_turns(model_dir, model):
    messages = _conversation(6)
    with pytest.raises(ContextWindowError):
        model.chat(messages, max_tokens=4)
    stream = model.chat(messages, stream=True, max_tokens=4, stop_tokens=[], history_policy="drop_oldest")
    reply = stream.text()
    kept = stream.messages
    assert kept[0] == messages[0] and kept[-1] == messages[-1] and kept[1]["role"] == "user" and len(kept) > 2
    assert kept[1:] == messages[len(messages) - len(kept) + 1:]  # a suffix of the conversation
    assert len(chat_prompt_ids(model, kept)) + 4 <= WINDOW
    assert len(chat_prompt_ids(model, messages[:1] + messages[len(messages) - len(kept) - 1:])) + 4 > WINDOW
    fresh = tallow.load_model(model_dir)
    assert fresh.chat(kept, max_tokens=4, stop_tokens=[]) == reply
    with pytest.raises(tallow.Error, match="history_policy"):
        model.chat(messages, history_policy="truncate")


def test_drop_oldest_still_refuses_a_last_message_that_cannot_fit(model):
    messages = [{"role": "system", "content": "all"}, {"role": "user", "content": "the quick brown fox " * 15}]
    with pytest.raises(ContextWindowError, match="last message alone"):
        model.chat(messages, max_tokens=4, history_policy="drop_oldest")


def _chat_args(model_dir, *extra):
    from tallow.cli import chat as cli_chat
    parser = argparse.ArgumentParser()
    cli_chat.add_arguments(parser)
    return cli_chat, parser.parse_args(["--model", str(model_dir), "--max-tokens", "3", "--system", "all", *extra])


def test_cli_chat_refuses_or_drops_turns(model_dir, capsys):
    lines = "".join(f"fox {i}\n" for i in range(8)) + "/exit\n"
    cli_chat, args = _chat_args(model_dir)
    out = io.StringIO()
    assert cli_chat.run(args, stdin=io.StringIO(lines), stdout=out) == 0
    err = capsys.readouterr().err
    # refused with the way out, not a crash
    assert f"context window of {WINDOW}" in err and "--drop-oldest-turns" in err
    cli_chat, args = _chat_args(model_dir, "--drop-oldest-turns")
    out = io.StringIO()
    assert cli_chat.run(args, stdin=io.StringIO(lines), stdout=out) == 0
    err = capsys.readouterr().err
    assert out.getvalue().count("\n") == 8 and f"oldest messages to fit the {WINDOW}-token context window" in err


# ---- the real SmolLM2-135M-Instruct: its 8192-token window, from the GGUF metadata -------------------------

def test_smollm2_refuses_a_10000_token_prompt_before_computing(smollm2_gguf, monkeypatch):
    model = tallow.load_model(smollm2_gguf)
    assert model.context_window == 8192  # llama.context_length
    computed = []
    monkeypatch.setattr(model, "_forward", lambda *args: computed.append(args))
    with pytest.raises(ContextWindowError, match="10000 tokens .* context window of 8192"):
        model.generate([28] * 10_000, max_tokens=8)
    assert computed == [] and model.cache.length == 0  # not one layer ran

