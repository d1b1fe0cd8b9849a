"""A tiny random Llama built by `transformers`, saved with a byte-level BPE tokenizer
trained here and a ChatML template: the model the generation and context-window tests
drive (tallow loads the folder; transformers is the reference)."""
import json

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tiny_llama(path, text, **config):
    """Train the tokenizer on `text`, save it with a random Llama (config overrides in
    `config`, e.g. max_position_embeddings) into `path`; returns the reference model."""
    import tokenizers
    import torch
    import transformers as tf

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=320,
                                             special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}))
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**{**dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None),
                            **config})
    ref = tf.LlamaForCausalLM(cfg).eval()
    ref.save_pretrained(path, safe_serialization=True)
    return ref
