"""``zoo finetune`` on chat data (issue 29 item 1): ``{"messages": [...]}`` JSONL goes
through the tokenizer's chat template with the loss on the assistant turns only, the
held-out loss falls, the template travels with the fine-tuned folder, and
``--chat-template FILE`` replaces it. ``--loss-chunk-size`` reaches the compiled loss.

The model: a Llama of the tiny fixture's shape (tests/fixtures/hf/llama_mha_tied) with
the Qwen2.5 chat fixture's tokenizer (its ``<|im_start|>``/``<|im_end|>`` are ids 321 and
322, so V = 336), written as a Hugging Face folder. One run on one device (the layouts'
parity is tests/training/test_lm_finetune.py's); the rest compiles nothing.
"""

import json
import pathlib

import keras
import numpy as np
import pytest

from zoo.cli.main import build_parser
from zoo.config import schema
from zoo.config.settings import GenerateSettings
from zoo.data.chat_files import load_chat_file
from zoo.models import GPTBackbone, GPTCausalLM, GPTCausalLMPreprocessor
from zoo.models.gpt._generation import tokenize_conversations
from zoo.tokenizers import HFTokenizer
from zoo.training.finetune import FinetuneSettings, finetune
from zoo.training.lm_finetune import causal_lm_config, compile_causal_lm, heldout_loss, load_lm_file, use_chat_template

HF = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
LENGTH, BATCH, CHUNK = 48, 4, 8  # a conversation: 42 tokens
WORDS = ("red", "blue", "cat", "dog", "sun", "tree")
# a template of the user's own (no system turn): the assistant's turn in {% generation %}
OWN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}"
)


def _conversations(count, seed):
    """User 'a b', assistant 'b a': the answer's words come from the question."""
    rng = np.random.RandomState(seed)
    return [
        {
            "messages": [
                {"role": "system", "content": "swap"},
                {"role": "user", "content": f"{WORDS[a]} {WORDS[b]}"},
                {"role": "assistant", "content": f"{WORDS[b]} {WORDS[a]}"},
            ]
        }
        for a, b in rng.randint(0, len(WORDS), (count, 2))
    ]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The Hugging Face folder (random weights), and the chat files beside it."""
    root = tmp_path_factory.mktemp("chat_finetune")
    config = {**causal_lm_config(HF / "llama_mha_tied"), "vocabulary_size": 336}
    keras.utils.set_random_seed(0)
    tokenizer = HFTokenizer.from_directory(HF / "chat_qwen2_5")
    model = GPTCausalLM(GPTBackbone.from_config(config), GPTCausalLMPreprocessor(tokenizer, LENGTH))
    model.save_to_hf(root / "base", report=lambda line: None)
    _write_jsonl(root / "train.jsonl", _conversations(32, seed=0))
    _write_jsonl(root / "held_out.jsonl", _conversations(8, seed=1))
    return root


def test_chat_data_trains_on_the_assistant_turns_and_keeps_the_template(folder):
    """``zoo finetune BASE --data-file chat.jsonl --method full --loss-chunk-size 8``: the rows are those
    of ``load_chat_file`` (the loss on the assistant turns), the held-out loss, computed in
    chunks, starts where the whole-logits loss does and falls, and the fine-tuned folder's
    tokenizer renders conversations as the base's."""
    base, output = folder / "base", folder / "tuned"
    preprocessor = GPTCausalLMPreprocessor(HFTokenizer.from_directory(base), LENGTH)
    train, held_out = (load_chat_file(folder / name, preprocessor) for name in ("train.jsonl", "held_out.jsonl"))
    assert (
        0 < train.loss_tokens < np.count_nonzero(train.token_ids != preprocessor.tokenizer.pad_token_id)
    )  # assistant turns only
    plain = GPTCausalLM.from_preset(base)
    compile_causal_lm(plain, keras.optimizers.SGD(1.0))
    whole_logits_loss = heldout_loss(plain, held_out, batch_size=BATCH)

    argv = [
        "finetune",
        str(base),
        "--data-file",
        str(folder / "train.jsonl"),
        "--validation-file",
        str(folder / "held_out.jsonl"),
        "--sequence-length",
        str(LENGTH),
        "--batch-size",
        str(BATCH),
        "--epochs",
        "2",
        "--method",
        "full",
        "--optimizer",
        "sgd",
        "--learning-rate",
        "1.0",
        "--loss-chunk-size",
        str(CHUNK),
        "--output",
        str(output),
    ]
    lines = []
    result = finetune(schema.from_args(FinetuneSettings, build_parser().parse_args(argv)), report=lines.append)
    expected = (
        f"data {folder / 'train.jsonl'}: {len(train)} training examples ({train.loss_tokens:,} tokens in the loss), "
        f"{len(held_out)} held out ({held_out.loss_tokens:,})"
    )
    assert expected in lines, lines
    assert result["model"].loss_chunk_size == CHUNK
    assert result["heldout_loss_before"] == pytest.approx(whole_logits_loss, rel=1e-5)
    assert result["heldout_loss"] < result["heldout_loss_before"] - 0.5, lines

    tuned = HFTokenizer.from_directory(output)
    conversation = _conversations(1, seed=2)[0]["messages"]
    assert tuned.chat_template == preprocessor.tokenizer.chat_template
    for tokenize in (False, True):
        np.testing.assert_array_equal(
            tuned.apply_chat_template(conversation, tokenize=tokenize),
            preprocessor.tokenizer.apply_chat_template(conversation, tokenize=tokenize),
        )


def test_chat_template_file_replaces_the_tokenizers_and_is_saved(folder, tmp_path):
    """``--chat-template FILE``: the rows and loss mask come from that template, and the
    tokenizer saved with the model holds it."""
    template_file = tmp_path / "chat_template.jinja"
    template_file.write_text(OWN_TEMPLATE)
    preprocessor = GPTCausalLMPreprocessor(HFTokenizer.from_directory(folder / "base"), LENGTH)
    use_chat_template(preprocessor.tokenizer, template_file)
    examples = load_lm_file(folder / "train.jsonl", preprocessor)
    tokenizer = preprocessor.tokenizer
    # row 0 by hand: every turn as the template writes it; the loss on the answer and its <|im_end|> only
    system, user, assistant = _conversations(1, seed=0)[0]["messages"]
    prefix = (
        "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in (system, user))
        + "<|im_start|>assistant\n"
    )
    answered = prefix + f"{assistant['content']}<|im_end|>"
    prefix_ids, answered_ids, ids = (tokenizer.encode(text) for text in (prefix, answered, answered + "\n"))
    np.testing.assert_array_equal(examples.token_ids[0, : len(ids)], ids)
    expected = np.zeros(LENGTH, np.float32)  # label t is token t + 1
    expected[len(prefix_ids) - 1 : len(answered_ids) - 1] = 1
    np.testing.assert_array_equal(examples.sample_weight[0], expected)
    tokenizer.save_to_directory(tmp_path / "saved")
    assert HFTokenizer.from_directory(tmp_path / "saved").chat_template.template == OWN_TEMPLATE


def test_chat_data_needs_a_template_and_a_template_needs_a_hugging_face_tokenizer(folder, tmp_path):
    no_template = HF / "llama_mha_tied"  # a base model's folder: no chat template
    with pytest.raises(
        ValueError,
        match=r'train.jsonl: \{"messages"\} data goes through a chat template, and the model\'s tokenizer '
        r"\(HFTokenizer\) has none; give --chat-template FILE",
    ):
        finetune(
            FinetuneSettings(preset=str(no_template), data_file=str(folder / "train.jsonl"), sequence_length=LENGTH),
            report=lambda line: None,
        )
    (tmp_path / "t.jinja").write_text(OWN_TEMPLATE)
    with pytest.raises(ValueError, match=r"--chat-template .*t.jinja: the model's tokenizer is a ByteTokenizer"):
        from zoo.tokenizers import ByteTokenizer

        use_chat_template(ByteTokenizer(), tmp_path / "t.jinja")


def test_generate_a_reply_to_messages_in_python_and_with_zoo_generate_chat(folder, capsys):
    """``generate(messages=...)`` generates from the template's ids with the generation
    prompt (transformers' ``apply_chat_template(..., add_generation_prompt=True)``) and
    returns the reply alone, streamed as it comes; ``zoo generate --chat`` prints it."""
    model = GPTCausalLM.from_preset(folder / "base")
    tokenizer = model.preprocessor.tokenizer
    first, second = (conversation["messages"][1:2] for conversation in _conversations(2, seed=3))  # a user's message
    ids = tokenizer.apply_chat_template(first, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(first, add_generation_prompt=True, tokenize=False).endswith(
        "<|im_start|>assistant\n"
    )
    streamed = []
    reply = model.generate(
        messages=first, max_new_tokens=6, stop_token_ids=(), stream=lambda pieces: streamed.append(pieces[0])
    )
    tokens = model.generate([list(ids)], 6, stop_token_ids=())  # (1, P + 6)
    assert reply == tokenizer.decode(tokens[0, len(ids) :]) == "".join(streamed) and reply
    # a list of conversations: each row its template's ids, left-padded
    batch, starts = tokenize_conversations(model, [first, second], model.backbone.vocabulary_size, 0)
    for row, start, conversation in zip(batch, starts, (first, second)):
        np.testing.assert_array_equal(
            row[start:], tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        )
    with pytest.raises(ValueError, match="generate takes prompts .* or messages .*, one of them; got both"):
        model.generate("hi", 2, messages=first)

    from zoo.training.gpt import generate

    argv = [
        "generate",
        "--model",
        str(folder / "base"),
        "--chat",
        "--prompt",
        first[0]["content"],
        "--max-new-tokens",
        "6",
        "--sampler",
        "greedy",
        "--stop-token-ids",
        "",
    ]
    config = schema.from_args(GenerateSettings, build_parser().parse_args(argv))
    printed = []
    text = generate(config, report=lambda *pieces, **options: printed.append("".join(pieces)))
    assert text == reply and "".join(printed) == reply  # the reply, then report("") ends the line
