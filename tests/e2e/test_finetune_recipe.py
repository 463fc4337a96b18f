"""End to end: recipes/finetune.yaml from a post-trained checkpoint of each template shape.

The start is what a team brings: a `tiny`-preset model saved with a tokenizer carrying one of the
three test templates (tests/data/templates/: Qwen3-like ChatML with an `enable_thinking` kwarg and
history truncation; ChatML switched by a `/no_think` system flag; Llama 3 headers, tool calls read
as mappings, no traces), or a published one byte for byte (tests/data/templates/published/:
Nemotron 3 Nano's, whose untraced turns train after its own reasoning-off prompt; Llama 3.1's, with
its special tokens in the tokenizer and no place for reasoning). Its own pretraining: none (not the session's shared one). The team's
domain is five hand-written unit conversions (below), kept as parquet, as a `datasets`
save_to_disk directory and as JSONL, each read as it is (no conversion step); the text SFT must
supervise in each is written out by hand per template, reasoning on and off.

One full run (the kwarg shape, half the conversations reasoning-off): sft -> rl -> quantize, RL on
the domain's four verifiable rows with two held-out ones. Two SFT-only runs for the other shapes:
the system flag named in tokenizer.reasoning_switch (half off), and Llama 3 with every
conversation off (its template writes no traces) as Llama-Nemotron says it, `detailed thinking
off`, scored on held-out conversations without traces. Nemotron 3 Nano's runs SFT (half off; the
demo's calculator conversations are multi-turn tool trajectories) then two RL steps, whose prompts
are its template's and whose generation stops at its <|im_end|>. Llama 3.1's runs SFT under
`stages.sft.data.reasoning_content: drop`, on the demo's traced conversations and held-out set. Checked: each run exits 0; every
checkpoint handed on carries the start's template byte for byte; the packed rows supervise
exactly the hand-written spans; `stagewise data pack --tokenizer CKPT` reports the supervised
tokens (and reasoning-off count) SFT's packing report does for the same sample, and the
hand-written spans' tokens for the team's file; the reasoning-off conversations are the seeded
ones (data.chat.reasoning_enabled) in the model's own off form.

Runtime on a 2-core machine: ~3 minutes when quiet (the full run ~65 s, each SFT-only run ~40 s, most of
it the CLI's start and Prefect's temporary server), ~4 minutes beside another test session.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "finetune.yaml"
TEMPLATES = ROOT / "tests" / "data" / "templates"
SEED = 1234  # tiny.yaml's, inherited; sub-stage 0 packs with seed + 0 (data/sft_assembly.py pack_seed)
PACK = 512
HEADER_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
"""Llama 3's special tokens (the last two only Llama 3.1's built-in tools write)."""
# One xdist worker runs the module (python3 dev.py test: --dist loadgroup), so each run happens once.
pytestmark = pytest.mark.xdist_group("finetune_recipe")

# --------------------------------------------------------------------------- the team's domain, by hand

TOOLS = [{"type": "function", "function": {"name": "convert", "description": "Convert a length between units.",
          "parameters": {"type": "object", "properties": {"value": {"type": "number"}, "unit": {"type": "string"}}}}}]


def qa(question: str, trace: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer, "reasoning_content": trace}]


CONVERSATIONS = [
    {"id": "units-cm", "messages": qa("How many centimetres are in 3 metres?", "A metre is 100 centimetres: 3 x 100.", "300")},
    {"id": "units-g", "messages": qa("How many grams are in 2 kilograms?", "A kilogram is 1000 grams: 2 x 1000.", "2000")},
    {"id": "units-s", "messages": [{"role": "system", "content": "Answer with the number only."},
                                   *qa("How many seconds are in 4 minutes?", "A minute is 60 seconds: 4 x 60.", "240")]},
    {"id": "units-km", "messages": [*qa("How many metres are in 2 kilometres?", "A kilometre is 1000 metres: 2 x 1000.", "2000"),
                                    *qa("And in 5 kilometres?", "5 x 1000.", "5000")]},
    {"id": "units-ft", "tools": TOOLS, "messages": [
        {"role": "user", "content": "Convert 7 feet to inches with the tool."},
        {"role": "assistant", "content": "", "reasoning_content": "The tool converts lengths.", "tool_calls": [
            {"type": "function", "function": {"name": "convert", "arguments": '{"value": 7, "unit": "in"}'}}]},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "7 feet are 84 inches."}]},
]
QUESTIONS = ["How many centimetres are in 3 metres?", "How many grams are in 2 kilograms?",
             "How many seconds are in 4 minutes?", "How many metres are in 2 kilometres?",
             "Convert 7 feet to inches with the tool."]
"""What finds the team's conversations among the packed ones (no demo conversation asks these)."""

CALL_QWEN = '<tool_call>\n{"name": "convert", "arguments": {"value": 7, "unit": "in"}}\n</tool_call><|im_end|>'
# conversation id -> (supervised text with reasoning on, with reasoning off), per template
KWARG_SPANS = {
    # after the last user turn the template always writes a trace block; enable_thinking=false puts the
    # empty one in the generation prompt, so off it is context and only the answer is trained
    "units-cm": (["<think>\nA metre is 100 centimetres: 3 x 100.\n</think>\n\n300<|im_end|>"], ["300<|im_end|>"]),
    "units-g": (["<think>\nA kilogram is 1000 grams: 2 x 1000.\n</think>\n\n2000<|im_end|>"], ["2000<|im_end|>"]),
    "units-s": (["<think>\nA minute is 60 seconds: 4 x 60.\n</think>\n\n240<|im_end|>"], ["240<|im_end|>"]),
    # not prefix-stable (the first turn's trace is dropped once a user turn follows): two examples
    "units-km": (["<think>\nA kilometre is 1000 metres: 2 x 1000.\n</think>\n\n2000<|im_end|>",
                  "<think>\n5 x 1000.\n</think>\n\n5000<|im_end|>"], ["2000<|im_end|>", "5000<|im_end|>"]),
    # on, the answer after the tool has no trace of its own: the template writes an empty one, trained
    "units-ft": (["<think>\nThe tool converts lengths.\n</think>\n\n" + CALL_QWEN,
                  "<think>\n\n</think>\n\n7 feet are 84 inches.<|im_end|>"], [CALL_QWEN, "7 feet are 84 inches.<|im_end|>"]),
}
FLAG_SPANS = {  # one newline after </think>; off (/no_think in the system prompt) the template writes no trace
    "units-cm": (["<think>\nA metre is 100 centimetres: 3 x 100.\n</think>\n300<|im_end|>"], ["300<|im_end|>"]),
    "units-g": (["<think>\nA kilogram is 1000 grams: 2 x 1000.\n</think>\n2000<|im_end|>"], ["2000<|im_end|>"]),
    "units-s": (["<think>\nA minute is 60 seconds: 4 x 60.\n</think>\n240<|im_end|>"], ["240<|im_end|>"]),
    "units-km": (["<think>\nA kilometre is 1000 metres: 2 x 1000.\n</think>\n2000<|im_end|>",
                  "<think>\n5 x 1000.\n</think>\n5000<|im_end|>"], ["2000<|im_end|>", "5000<|im_end|>"]),
    "units-ft": (["<think>\nThe tool converts lengths.\n</think>\n" + CALL_QWEN, "7 feet are 84 inches.<|im_end|>"],
                 [CALL_QWEN, "7 feet are 84 inches.<|im_end|>"]),
}
NEMOTRON_CALL = ("<tool_call>\n<function=convert>\n<parameter=value>\n7\n</parameter>\n<parameter=unit>\nin\n"
                 "</parameter>\n</function>\n</tool_call>\n<|im_end|>")
NEMOTRON_SPANS = {
    # its generation prompt opens the trace (`<think>\n`): a traced turn trains from the trace on; a turn
    # without one, written `<think></think>answer`, after its reasoning-off prompt (`<think></think>`), as
    # is every turn off
    "units-cm": (["A metre is 100 centimetres: 3 x 100.\n</think>\n300<|im_end|>"], ["300<|im_end|>"]),
    "units-g": (["A kilogram is 1000 grams: 2 x 1000.\n</think>\n2000<|im_end|>"], ["2000<|im_end|>"]),
    "units-s": (["A minute is 60 seconds: 4 x 60.\n</think>\n240<|im_end|>"], ["240<|im_end|>"]),
    # not prefix-stable on (the first turn's trace is dropped once a user turn follows): two examples
    "units-km": (["A kilometre is 1000 metres: 2 x 1000.\n</think>\n2000<|im_end|>", "5 x 1000.\n</think>\n5000<|im_end|>"],
                 ["2000<|im_end|>", "5000<|im_end|>"]),
    # the arguments as <parameter=...> blocks; off, the call's turn is `<think></think>\n<tool_call>...`
    "units-ft": (["The tool converts lengths.\n</think>\n" + NEMOTRON_CALL, "7 feet are 84 inches.<|im_end|>"],
                 ["\n" + NEMOTRON_CALL, "7 feet are 84 inches.<|im_end|>"]),
}
LLAMA_SPANS = {  # no traces at all (on is refused); the call as {"name", "parameters"} with the arguments a mapping
    "units-cm": (None, ["300<|eot_id|>"]),
    "units-g": (None, ["2000<|eot_id|>"]),
    "units-s": (None, ["240<|eot_id|>"]),
    "units-km": (None, ["2000<|eot_id|>", "5000<|eot_id|>"]),
    "units-ft": (None, ['{"name": "convert", "parameters": {"value": 7, "unit": "in"}}<|eot_id|>',
                        "7 feet are 84 inches.<|eot_id|>"]),
}


LLAMA31_SPANS = {  # reasoning_content: drop: every trace discarded as read, the answers alone (nothing is off)
    conv: (off, None) for conv, (_, off) in LLAMA_SPANS.items()}


def rl_row(i: str, question: str, answer: str) -> dict:
    return {"id": i, "responses_create_params": {"input": [{"role": "user", "content": question}]},
            "expected_answer": answer, "environment": "exact_answer", "domain": "my_domain"}


RL_ROWS = [rl_row("r1", "How many centimetres are in 4 metres?", "400"), rl_row("r2", "How many grams are in 3 kilograms?", "3000"),
           rl_row("r3", "How many seconds are in 2 minutes?", "120"), rl_row("r4", "How many metres are in 6 kilometres?", "6000")]
RL_HELDOUT = [rl_row("h1", "How many centimetres are in 9 metres?", "900"),  # dev and dev (eval/splits.py, seed 1234)
              rl_row("h2", "How many seconds are in 5 minutes?", "300"),
              rl_row("h3", "How many grams are in 7 kilograms?", "7000"),  # test and test
              rl_row("h4", "How many metres are in 2 kilometres?", "2000")]
SFT_HELDOUT = [{"id": "units-h1", "messages": [{"role": "user", "content": "How many centimetres are in 8 metres?"},
                                               {"role": "assistant", "content": "800"}]}]


@dataclass(frozen=True)
class Shape:
    """One start checkpoint and how the team keeps and runs its data with it."""

    template: str
    rows: str
    """How the team's file is kept: parquet, datasets (save_to_disk) or jsonl."""
    off_fraction: float
    switch: str | None
    """tokenizer.reasoning_switch as YAML (None: auto, read from the template)."""
    spans: dict
    own_heldout: bool = False
    """Score SFT on the team's trace-free held-out conversations (the demo's carry traces)."""
    stages: tuple[str, ...] = ("sft",)
    """The stages it runs."""
    drop: bool = False
    """stages.sft.data.reasoning_content: drop."""
    pack: int = PACK
    """The SFT sub-stage's seq_length (Nemotron's and Llama 3.1's tool prompts are ~700 tokens of the test tokenizer)."""

    @property
    def name(self) -> str:
        return Path(self.template).name.removesuffix(".jinja")


KWARG = Shape("chatml_think_kwarg.jinja", "parquet", 0.5, None, KWARG_SPANS, stages=("sft", "rl", "quantize"))
FLAG = Shape("chatml_system_flag.jinja", "datasets", 0.5, "{kind: system_flag, when_off: /no_think, when_on: /think}",
             FLAG_SPANS)
LLAMA = Shape("llama3_tools.jinja", "jsonl", 1.0,
              "{kind: system_flag, when_off: detailed thinking off, when_on: detailed thinking on}", LLAMA_SPANS,
              own_heldout=True)
NEMOTRON = Shape("published/nemotron_3_nano.jinja", "jsonl", 0.5, None, NEMOTRON_SPANS, stages=("sft", "rl"), pack=1024)
LLAMA31 = Shape("published/llama3_1.jinja", "parquet", 0.0, None, LLAMA31_SPANS, drop=True, pack=1024)
SHAPES = [KWARG, FLAG, LLAMA, NEMOTRON, LLAMA31]

SFT_SETS = ["stages.sft.data.world.per_domain=40", "stages.sft.data.heldout_limit=4", "stages.sft.eval_suite=null",
            "stages.sft.stages[0].tokens=4096", "stages.sft.stages[0].schedule.warmup_tokens=0"]
"""Two steps of 4 x 512-token packs, a small demo world, four held-out answers, no lm-eval suite."""
FULL_SETS = ["data.world.stdlib_files=2", "data.world.facts=200", "data.world.arithmetic=200",
             "stages.rl.steps=2", "stages.rl.prompts_per_step=2", "stages.rl.rollout.group_size=2",
             "stages.rl.rollout.max_new_tokens=8", "stages.rl.filter.samples=2", "stages.rl.data.heldout_samples=2",
             "stages.quantize.calib_batches=1", "stages.quantize.score_batches=1", "stages.quantize.batch_size=1",
             "stages.quantize.seq_length=64", "stages.quantize.val_tokens=1024", "stages.quantize.heldout_limit=2",
             "stages.quantize.eval_suite=null"]
"""Two RL steps of 2 prompts x 2 samples; quantize on one 64-token calibration batch."""


# --------------------------------------------------------------------------- fixtures

def write_rows(rows: list[dict], how: str, out: Path) -> Path:
    """The team's conversations as it keeps them: JSONL, parquet or a `datasets` directory, `tools` a JSON
    string in the columnar ones (an Arrow column cannot hold free-form JSON schemas, as on the Hub)."""
    if how == "jsonl":
        path = out.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    columns = [{**r, "tools": json.dumps(r["tools"]) if "tools" in r else None} for r in rows]
    if how == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(columns), out.with_suffix(".parquet"))
        return out.with_suffix(".parquet")
    import datasets

    datasets.Dataset.from_list(columns).save_to_disk(str(out))
    return out


def jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The team's files: the conversations in each form, RL rows and held-out rows."""
    d = tmp_path_factory.mktemp("my_domain")
    out = {how: write_rows(CONVERSATIONS, how, d / f"sft_{how}") for how in ("jsonl", "parquet", "datasets")}
    out |= {"rl": jsonl(RL_ROWS, d / "rl.jsonl"), "rl_heldout": jsonl(RL_HELDOUT, d / "rl_heldout.jsonl"),
            "sft_heldout": jsonl(SFT_HELDOUT, d / "sft_heldout.jsonl")}
    return out


@pytest.fixture(scope="module")
def checkpoint(chat_tokenizer_dir, tmp_path_factory):
    """`checkpoint(shape)`: a tiny model saved with the session's chat tokenizer (plus Llama 3's header
    tokens) carrying the shape's test template in place of ours: a post-trained checkpoint's own."""
    from transformers import AutoTokenizer

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    made: dict[str, Path] = {}

    def make(shape: Shape) -> Path:
        if shape.name not in made:
            tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
            tok.add_tokens(HEADER_TOKENS, special_tokens=True)
            tok.chat_template = (TEMPLATES / shape.template).read_text()
            out = tmp_path_factory.mktemp(f"start-{shape.name}")
            tok.save_pretrained(out)
            build_model(ModelConfig(preset="tiny"), len(tok), seed=0).save_pretrained(out)
            made[shape.name] = out
        return made[shape.name]

    return make


@dataclass(frozen=True)
class Run:
    start: Path
    summary: dict
    workdir: Path
    sft_metrics: dict

    def packed(self) -> Path:
        """The sub-stage's packed data: rows.npz, sample.jsonl, report.json."""
        (root,) = (self.workdir / "sft_data").glob("packed-domain-*")
        return root


@pytest.fixture(scope="module")
def finetuned(cli, checkpoint, files, tmp_path_factory):
    """`finetuned(shape)`: `stagewise run recipes/finetune.yaml --set model.from=START ...`, once per shape;
    the kwarg shape runs every stage, the others SFT only."""
    from mlflow import MlflowClient

    done: dict[str, Run] = {}

    def run(shape: Shape) -> Run:
        if shape.name in done:
            return done[shape.name]
        start, workdir = checkpoint(shape), tmp_path_factory.mktemp(f"finetune-{shape.name}")
        values = [f"workdir={workdir}", f"model.from={start}", f"stages.sft.data.sources[0].path={files[shape.rows]}",
                  *SFT_SETS, f"stages.sft.stages[0].blend.reasoning_off_fraction={shape.off_fraction}"]
        values += [f"tokenizer.reasoning_switch={shape.switch}"] if shape.switch else []
        values += [f"stages.sft.data.heldout={files['sft_heldout']}"] if shape.own_heldout else []
        values += ["stages.sft.data.reasoning_content=drop"] if shape.drop else []
        values += [f"stages.sft.stages[0].seq_length={shape.pack}"] if shape.pack != PACK else []
        if "rl" in shape.stages:
            values += [f"stages.rl.data.sources[0].path={files['rl']}", f"stages.rl.data.heldout={files['rl_heldout']}",
                       *FULL_SETS]
        stages = ["--stages", ",".join(shape.stages)]
        summary = cli.summary(cli("run", str(RECIPE), *stages, *cli.sets(*values), "--json", timeout=900))
        client = MlflowClient(tracking_uri=summary["tracking_uri"])
        done[shape.name] = Run(start, summary, workdir, client.get_run(summary["stages"][0]["run_id"]).data.metrics)
        return done[shape.name]

    return run


# --------------------------------------------------------------------------- helpers

def data_pack(source: Path, tokenizer: Path, shape: Shape, fraction: float, out: Path | None = None):
    """`stagewise data pack SOURCE --tokenizer CKPT` with the sub-stage's fraction, seed and switch."""
    from stagewise.cli import app

    args = ["data", "pack", str(source), "--tokenizer", str(tokenizer), "--pack-size", str(shape.pack),
            "--reasoning-off-fraction", str(fraction), "--seed", str(SEED), "--json"]
    args += ["--reasoning-switch", shape.switch] if shape.switch else []
    args += ["--reasoning-content", "drop"] if shape.drop else []
    args += ["--out", str(out)] if out else []
    return CliRunner().invoke(app, args)


def segments(rows: dict, tokenizer) -> list[tuple[str, list[str]]]:
    """Every packed conversation example: (its text, the text of each run of supervised tokens)."""
    out = []
    for ids, labels, seq in zip(rows["input_ids"], rows["labels"], rows["seq_idx"]):
        for s in np.unique(seq):
            at = np.flatnonzero(seq == s)
            runs, cur = [], []
            for t in at:  # labels[t] is the target at t: token t + 1 where it is supervised
                if labels[t] != -100:
                    cur.append(int(labels[t]))
                elif cur:
                    runs, cur = [*runs, tokenizer.decode(cur)], []
            out.append((tokenizer.decode(ids[at]), runs + ([tokenizer.decode(cur)] if cur else [])))
    return out


def ours(segs: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The team's examples among them."""
    return [(text, runs) for text, runs in segs if any(q in text for q in QUESTIONS)]


def expected_spans(shape: Shape, fraction: float) -> Counter:
    """The hand-written spans of the team's conversations, each on or off as the seeded choice makes it."""
    from stagewise.data.chat import reasoning_enabled

    spans = Counter()
    for conv in CONVERSATIONS:
        on, off = shape.spans[conv["id"]]
        spans.update(on if reasoning_enabled(conv, fraction, SEED) else off)
    return spans


def tokens_of(spans: Counter, tokenizer) -> int:
    return sum(n * len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s, n in spans.items())


def template_of(ckpt: Path) -> tuple:
    """The chat template a checkpoint carries, as bytes on disk: tokenizer_config.json's and chat_template.jinja."""
    config = json.loads((Path(ckpt) / "tokenizer_config.json").read_text())
    jinja = Path(ckpt) / "chat_template.jinja"
    return config.get("chat_template"), jinja.read_bytes() if jinja.is_file() else None


def load_rows(path: Path) -> dict:
    from stagewise.data.sft_packs import load_packed

    return load_packed(path)


def auto_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# --------------------------------------------------------------------------- the team's file alone (no run)

@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_the_teams_file_packs_to_the_hand_checked_spans(shape, checkpoint, files, tmp_path):
    """`data pack --tokenizer CKPT` on the five conversations, all on, all off and the seeded half:
    the supervised text is the hand-written spans and the supervised tokens are theirs."""
    start = checkpoint(shape)
    tok = auto_tokenizer(start)
    if shape.drop:  # the traces kept, through a template with no place for them: refused, naming the way out
        kept = data_pack(files["jsonl"], start, Shape(**{**shape.__dict__, "drop": False}), 0.0)
        assert kept.exit_code == 2 and "reasoning_content: drop" in kept.output, kept.output
    for fraction in [0.0] if shape.drop else sorted({0.0, 1.0, shape.off_fraction}):  # no switch: nothing is off
        result = data_pack(files["jsonl"], start, shape, fraction, tmp_path / f"{fraction}.npz")
        if shape is LLAMA and fraction < 1.0:  # its template writes no trace: training on one is refused
            assert result.exit_code == 2 and "does not write the turn's reasoning_content" in result.output, result.output
            continue
        assert result.exit_code == 0, result.output
        report, spans = json.loads(result.stdout), expected_spans(shape, fraction)
        runs = Counter(r for _, rs in segments(load_rows(tmp_path / f"{fraction}.npz"), tok) for r in rs)
        assert runs == spans, (fraction, runs)
        assert report["supervised_tokens"] == tokens_of(spans, tok) and report["conversations"] == 5


# --------------------------------------------------------------------------- the runs

@pytest.mark.slow
def test_the_full_run_fine_tunes_then_rl_then_quantizes(finetuned):
    run = finetuned(KWARG)
    sft, rl, quantize = run.summary["stages"]
    assert [s["stage"] for s in run.summary["stages"]] == ["sft", "rl", "quantize"]
    assert (sft["parent"], rl["parent"], quantize["parent"]) == (str(run.start), sft["checkpoint"], rl["checkpoint"])
    m = rl["metrics"]  # RL on the domain's verifiable rows: held-out pass@1 of my_domain before and after
    assert {"base/rl/test/pass_at_1/my_domain", "rl/test/pass_at_1/my_domain", "rl/dev/pass_at_1/my_domain"} <= set(m), sorted(m)
    from mlflow import MlflowClient

    logged = MlflowClient(tracking_uri=run.summary["tracking_uri"]).get_run(rl["run_id"]).data.metrics
    profiled = sum(logged[f"rl/filter/{k}"] for k in ("kept", "dropped_solved", "dropped_unsolved"))
    assert profiled == len(RL_ROWS)  # every one of the domain's rows, nothing else
    assert quantize["metrics"]["effective_bits"] <= 6.0 + 1e-9
    assert (Path(quantize["checkpoint"]) / "hf_quant_config.json").is_file()


@pytest.mark.slow
def test_rl_from_nemotron_prompts_through_its_template_and_stops_at_its_turn_end(finetuned, files):
    """SFT from Nemotron 3 Nano's own template on the demo's multi-turn tool conversations exits 0; RL
    from it writes each prompt as that template does (stages.rl.reasoning is off: its `<think></think>`
    prompt) and ends each response at the template's turn end, <|im_end|>, which the checkpoints'
    generation configs list among their eos ids."""
    from stagewise.eval.heldout import end_ids
    from stagewise.eval.rewards import RewardConfig
    from stagewise.eval.rl_wiring import RLWiring
    from stagewise.eval.rl_wiring import load_rows as rl_rows

    run = finetuned(NEMOTRON)
    sft, rl = run.summary["stages"]
    assert (sft["stage"], rl["stage"]) == ("sft", "rl") and rl["parent"] == sft["checkpoint"]
    assert "base/rl/test/pass_at_1/my_domain" in rl["metrics"], sorted(rl["metrics"])
    tok = auto_tokenizer(Path(sft["checkpoint"]))
    sample = [json.loads(line) for line in (run.packed() / "sample.jsonl").read_text().splitlines()]
    trajectories = [s for s in sample if s["domain"] == "calculator"]  # call, the tool's reply, the answer
    assert trajectories and json.loads((run.packed() / "report.json").read_text())["packing"]["dropped"] == 0
    packed = segments(load_rows(run.packed() / "rows.npz"), tok)
    answers = [t for t, runs in packed if "<tool_response>" in t and any(r.endswith("<|im_end|>") for r in runs)]
    assert len(answers) >= len(trajectories), (len(answers), len(trajectories))
    wiring = RLWiring(tok, rl_rows(files["rl"], "my_domain", None, None), RewardConfig(), reasoning=False)
    for row in RL_ROWS:
        question = row["responses_create_params"]["input"][0]["content"]
        published = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            tokenize=False, enable_thinking=False)
        assert published.endswith(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think></think>")
        assert list(wiring.prompts[f"my_domain:{row['id']}"].ids) == tok(published, add_special_tokens=False)["input_ids"]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert end_ids(tok)[0] == im_end
    for stage in (sft, rl):
        eos = json.loads((Path(stage["checkpoint"]) / "generation_config.json").read_text())["eos_token_id"]
        assert im_end in (eos if isinstance(eos, list) else [eos]), (stage["stage"], eos)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_every_checkpoint_handed_on_carries_the_starts_template_byte_for_byte(shape, finetuned):
    run = finetuned(shape)
    start = template_of(run.start)
    assert start[1] == (TEMPLATES / shape.template).read_bytes()  # the shape's, not ours installed over it
    for stage in run.summary["stages"]:
        assert template_of(Path(stage["checkpoint"])) == start, stage["stage"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_sft_trains_the_hand_checked_spans(shape, finetuned):
    """The packed rows SFT trained on: the team's examples supervise exactly the hand-written spans."""
    run = finetuned(shape)
    segs = segments(load_rows(run.packed() / "rows.npz"), auto_tokenizer(run.start))
    assert Counter(r for _, rs in ours(segs) for r in rs) == expected_spans(shape, shape.off_fraction)
    assert run.sft_metrics["sft/curate/my_domain/kept"] == 5  # read as kept: parquet, datasets dir, JSONL


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_data_pack_reports_what_sft_packed(shape, finetuned, tmp_path):
    """The sample SFT drew (the team's five and a slice of every demo domain), packed again by the CLI
    with the sub-stage's fraction, seed and switch: the same supervised tokens and reasoning-off count
    as the packing report and its MLflow metrics."""
    run = finetuned(shape)
    report = json.loads((run.packed() / "report.json").read_text())["packing"]
    sample = [json.loads(line)["conversation"] for line in (run.packed() / "sample.jsonl").read_text().splitlines()]
    assert sum(1 for c in sample if c["id"].startswith("units-")) == 5  # every one of the team's conversations
    result = data_pack(jsonl(sample, tmp_path / "sample.jsonl"), run.start, shape, shape.off_fraction)
    assert result.exit_code == 0, result.output
    cli = json.loads(result.stdout)
    m = run.sft_metrics
    assert cli["supervised_tokens"] == report["supervised_tokens"] == m["sft/domain/supervised_tokens"]
    assert cli["reasoning_off"] == report["reasoning_off"] == m["sft/domain/reasoning_off"]
    assert cli["conversations"] == report["conversations"] == len(sample)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_the_reasoning_off_conversations_are_the_seeded_ones_in_the_models_own_form(shape, finetuned):
    from stagewise.data.chat import reasoning_enabled

    run = finetuned(shape)
    sample = [json.loads(line)["conversation"] for line in (run.packed() / "sample.jsonl").read_text().splitlines()]
    off = [c["id"] for c in sample if not reasoning_enabled(c, shape.off_fraction, SEED)]
    assert run.sft_metrics["sft/domain/reasoning_off"] == len(off)
    if shape.off_fraction == 0.5:
        assert 0.3 * len(sample) <= len(off) <= 0.7 * len(sample)  # roughly half: 14 of 25 here
    else:
        assert len(off) == len(sample) * shape.off_fraction
    packed = ours(segments(load_rows(run.packed() / "rows.npz"), auto_tokenizer(run.start)))
    for conv, question in zip(CONVERSATIONS, QUESTIONS):
        text = "".join(t for t, _ in packed if question in t)  # its examples (two when the template splits it)
        traces = [m["reasoning_content"] for m in conv["messages"] if m.get("reasoning_content")]
        if shape is KWARG and conv["id"] in off:  # enable_thinking=false: the empty trace opens the answer
            assert "<|im_start|>assistant\n<think>\n\n</think>\n\n" in text and not any(t in text for t in traces)
        elif shape is KWARG:  # the last turn's own trace (the template's empty one when it has none)
            assert f"<think>\n{conv['messages'][-1].get('reasoning_content', '')}\n</think>" in text, text
        elif shape is FLAG:  # the flag is the system prompt's last paragraph, read by the template
            flag = "/no_think" if conv["id"] in off else "/think"
            assert f"\n{flag}<|im_end|>" in text or f"\n{flag}\n\n<tools>" in text, text
            assert any(t in text for t in traces) == (conv["id"] not in off)
        elif shape is LLAMA:
            assert "detailed thinking off<|eot_id|>" in text and not any(t in text for t in traces)
        # Nemotron 3 Nano: off, every answer follows the empty trace of the off prompt, and no trace is written
        elif shape is NEMOTRON and conv["id"] in off:
            assert "<|im_start|>assistant\n<think></think>" in text and not any(t in text for t in traces), text
        elif shape is NEMOTRON:  # on, the last turn's own trace (the answer after a tool's reply has none)
            last = conv["messages"][-1]
            written = (f"<think>\n{last['reasoning_content']}\n</think>\n" if last.get("reasoning_content")
                       else "<think></think>") + last["content"] + "<|im_end|>"
            assert written in text, text
        else:  # Llama 3.1 under drop: nothing is off, and no trace is written
            assert not any(t in text for t in traces), text
