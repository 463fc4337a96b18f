"""The corpus build at scale: in process, on Ray with 1 and 2 workers, and on a local two-node Ray cluster.

    python benchmarks/data_prep.py [--gb 1.0] [--small-gb 0.25] [--files 16] [--workdir runs/data_prep] [--json]

Data: a generated JSONL corpus of `--gb` GB in `--files` files (made once under the workdir, reused):
documents of 30-600 words drawn from a Zipf-distributed vocabulary of 20,000 made-up words (nothing any
setting was tuned on), with 1% exact and 1% near copies planted so both dedup shuffles have work. The
tokenizer is a 4,096-token byte-level BPE trained on its first 2 MB.

Runs, each `stagewise data build` in its own process into a fresh directory, with the default filters and
dedup (exact and near):
- in_process: the whole corpus in one process (its tokenizer batch-encodes on every core);
- ray1, ray2: a local Ray cluster the build starts, 1 and 2 workers (one tokenizer thread each);
- ray2_small: 2 workers on the first `--small-gb` worth of files, for the driver's memory against input size;
- two_nodes: `ray start --head` plus a second `ray start --address` on this host (one CPU each), 2 workers.

Reported per run: seconds (Ray's start included), tokens/s, documents/s, the driver's peak RSS; and
ray2_over_ray1, ray2_over_in_process (tokens/s ratios), driver_rss_ratio (ray2's driver peak RSS on the
whole corpus over ray2_small's) and `identical` (every whole-corpus run wrote the same shards and manifest,
byte for byte).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BIN = Path(sys.executable).parent
VOCAB, DOC_WORDS, BATCH = 20_000, (30, 600), 500


def made_up_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """n distinct pronounceable words of 2-4 syllables."""
    onsets = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "tr", "ch", "sh"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    words: set[str] = set()
    while len(words) < n:
        k = int(rng.integers(2, 5))
        words.add("".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))] for _ in range(k)))
    return np.array(sorted(words))


def generate(out: Path, gb: float, files: int, seed: int = 0) -> Path:
    """The corpus under out/ (reused when its stamp matches); the directory."""
    stamp = out / "stamp.json"
    want = {"gb": gb, "files": files, "seed": seed, "version": 1}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = made_up_words(rng, VOCAB)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    p /= p.sum()
    per_file = gb * 1e9 / files
    for f in range(files):
        with open(out / f"part-{f:05d}.jsonl", "w", encoding="utf-8") as fh:
            written, recent = 0, []
            while written < per_file:
                lengths = rng.integers(*DOC_WORDS, size=BATCH)
                words = vocab[rng.choice(VOCAB, size=int(lengths.sum()), p=p)].tolist()
                cuts = np.r_[0, np.cumsum(lengths)]
                lines = []
                for i in range(BATCH):
                    text = " ".join(words[cuts[i]:cuts[i + 1]])
                    roll = rng.random()
                    if roll < 0.01 and recent:  # an exact copy of a recent document
                        text = recent[int(rng.integers(len(recent)))]
                    elif roll < 0.02 and recent:  # a near copy: one word replaced
                        toks = recent[int(rng.integers(len(recent)))].split()
                        toks[int(rng.integers(len(toks)))] = "quartz"
                        text = " ".join(toks)
                    recent = (recent + [text])[-50:]
                    lines.append(json.dumps({"text": text}))
                chunk = "\n".join(lines) + "\n"
                fh.write(chunk)
                written += len(chunk)
    stamp.write_text(json.dumps(want))
    return out


def first_files(corpus: Path, n: int) -> Path:
    """A directory of links to the corpus's first n files: the smaller input, as its own source."""
    small = corpus / f"first-{n}"
    small.mkdir(exist_ok=True)
    for i in range(n):
        link = small / f"part-{i:05d}.jsonl"
        if not link.is_symlink():
            link.symlink_to(corpus / link.name)
    return small


def tokenizer(corpus: Path, out: Path) -> Path:
    """A 4,096-token BPE trained on the corpus's first 2 MB (made once)."""
    if (out / "tokenizer.json").is_file():
        return out
    from stagewise.data.tokenizer import train_bpe

    with open(corpus / "part-00000.jsonl", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f.read(2_000_000).splitlines()[:-1]]
    train_bpe(texts, 4096).save_pretrained(out)
    return out


def build(name: str, workdir: Path, source_glob: str, tok: Path, sets: list[str], timeout_s: float,
          env: dict | None = None) -> dict:
    """One `stagewise data build` in its own process; its report, and a digest of what it wrote."""
    recipe = workdir / f"{name}.yaml"
    recipe.write_text(json.dumps({"name": "data-prep-bench", "workdir": str(workdir / "runs"),
                                  "tokenizer": {"path": str(tok)},
                                  "data": {"sources": [{"name": "web", "path": source_glob}]}}))
    out = workdir / "out" / name
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cmd = [str(BIN / "stagewise"), "data", "build", str(recipe), "--out", str(out), "--json"]
    for s in sets:
        cmd += ["--set", s]
    print(f"{name}: {' '.join(sets) or 'in_process'}", file=sys.stderr, flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if run.returncode:
        raise RuntimeError(f"{name}: exit {run.returncode}\n{run.stderr[-3000:]}")
    built = json.loads(run.stdout)
    report = built["report"]
    report["duplicates"] = {kind: sum(s["duplicates"][kind] for s in built["manifest"]["sources"].values())
                            for kind in ("exact", "near")}
    report["output_sha256"] = _digest(out)
    subprocess.run(["rm", "-rf", str(out / ".work")], check=True)  # the scan files: as large as the input
    print(f"{name}: {report['seconds']['total']:.0f} s, {report['tokens_per_s']:,.0f} tokens/s, "
          f"driver {report['driver_peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    return report


def _digest(out: Path) -> str:
    """sha256 over every shard and the manifest (names and bytes, sorted): equal for equal outputs."""
    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file() and ".work" not in p.parts and p.name != "build_report.json":
            h.update(p.relative_to(out).as_posix().encode())
            with open(p, "rb") as f:
                while block := f.read(1 << 24):
                    h.update(block)
    return h.hexdigest()


def two_node_cluster():
    """Start a head and a second node (one CPU each) on this host; (address, env, stop).

    Its session files go to a short directory under /tmp: Ray refuses socket paths over 107 bytes, and the
    second node's sockets (`plasma_store.1`) are longer than the head's. Both nodes and the driver use token
    auth with the token at ~/.ray/auth_token, made first where it is missing (`ray get-auth-token --generate`
    only writes one that is not there), so a fresh machine and one where `ray.init` already wrote it agree.
    A node that does not start stops the other and raises with what `ray start` printed."""
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    ray = str(BIN / "ray")

    def stop() -> None:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)

    common = ["--num-cpus", "1", "--object-store-memory", str(200 * 1024**2), "--disable-usage-stats"]
    steps = [[ray, "get-auth-token", "--generate"],
             [ray, "start", "--head", "--port", str(port), "--include-dashboard", "false", "--temp-dir", str(temp),
              *common],
             [ray, "start", "--address", f"127.0.0.1:{port}", *common]]
    for cmd in steps:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        if run.returncode:
            stop()
            raise RuntimeError(f"{' '.join(cmd[1:3])}: exit {run.returncode}\n{(run.stdout + run.stderr)[-3000:]}")
    return f"127.0.0.1:{port}", env, stop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example: python benchmarks/data_prep.py --gb 1 --json")
    p.add_argument("--gb", type=float, default=1.0, help="corpus size in GB (default 1.0)")
    p.add_argument("--small-gb", type=float, default=0.25, help="the smaller input for the driver's memory (default 0.25)")
    p.add_argument("--files", type=int, default=16, help="JSONL files (default 16)")
    p.add_argument("--workdir", default="runs/data_prep", help="corpus, tokenizer and outputs go here")
    p.add_argument("--timeout-s", type=float, default=3600, help="per build (default 3600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    small_files = max(1, round(args.files * args.small_gb / args.gb))
    if small_files >= args.files:
        p.error("--small-gb must be below --gb")
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    corpus = generate(workdir / f"corpus-{args.gb:g}gb-{args.files}", args.gb, args.files)
    tok = tokenizer(corpus, workdir / "tokenizer")
    print(f"corpus ready in {time.monotonic() - t0:.0f} s: {corpus}", file=sys.stderr, flush=True)
    every, first = str(corpus / "part-*.jsonl"), str(first_files(corpus, small_files) / "part-*.jsonl")
    runs = {"in_process": build("in_process", workdir, every, tok, [], args.timeout_s)}
    for name, workers, src in (("ray1", 1, every), ("ray2", 2, every), ("ray2_small", 2, first)):
        runs[name] = build(name, workdir, src, tok, ["data.build.executor=ray", f"data.build.ray.workers={workers}"],
                           args.timeout_s)
    address, env, stop = two_node_cluster()
    try:
        runs["two_nodes"] = build("two_nodes", workdir, every, tok, [
            "data.build.executor=ray", "data.build.ray.workers=2", f"data.build.ray.address={address}"],
            args.timeout_s, env)
    finally:
        stop()
    rate = lambda name: runs[name]["tokens_per_s"]  # noqa: E731
    whole = [runs[n]["output_sha256"] for n in ("in_process", "ray1", "ray2", "two_nodes")]
    result = {"input_gb": round(runs["in_process"]["input_bytes"] / 1e9, 3),
              "small_input_gb": round(runs["ray2_small"]["input_bytes"] / 1e9, 3), "files": args.files,
              "cores": len(os.sched_getaffinity(0)), "runs": runs,
              "ray2_over_ray1": rate("ray2") / rate("ray1"), "ray2_over_in_process": rate("ray2") / rate("in_process"),
              "two_nodes_over_ray1": rate("two_nodes") / rate("ray1"),
              "driver_rss_ratio": runs["ray2"]["driver_peak_rss_mb"] / runs["ray2_small"]["driver_peak_rss_mb"],
              "identical": len(set(whole)) == 1}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for name, r in runs.items():
            print(f"{name:<11} {r['seconds']['total']:>8.1f} s {r['tokens_per_s']:>12,.0f} tokens/s "
                  f"{r['docs_per_s']:>10,.0f} docs/s  driver {r['driver_peak_rss_mb']:>6.0f} MB  nodes {r['nodes']}")
        print(f"ray2/ray1 {result['ray2_over_ray1']:.2f}x  ray2/in_process {result['ray2_over_in_process']:.2f}x  "
              f"two_nodes/ray1 {result['two_nodes_over_ray1']:.2f}x  driver RSS whole/small "
              f"{result['driver_rss_ratio']:.2f}  identical outputs: {result['identical']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
