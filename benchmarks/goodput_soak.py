"""Goodput under random kills (issue 20 item 6): the tiny recipe on 2 ranks under the supervisor, a random rank
killed (kill -9) every --kill-every seconds and, every --stop-every-th interruption, SIGSTOPped instead (caught by the
watchdog). Reports:

    goodput            productive step time / wall time: the steps the final model holds, at the interrupted job's
                       own seconds per step (its one-batch intervals, saves included, without those an
                       interruption falls in), over its wall time; and the same at the uninterrupted run's seconds
                       per step, which differ by up to 10% between runs on a busy 2-core machine
    lost               where the rest went: before the first step, from each kill to the restarted attempt's first
                       step, and retraining the steps since the checkpoint resumed from
    vs uninterrupted   the uninterrupted run's wall time / the interrupted job's (same steps, same machine)
    restart latency    from the kill (or the stop) to the first step of the restarted attempt, per interruption
    steps lost         per interruption: the steps trained since the checkpoint it resumed from

and checks that the final weights equal the uninterrupted run's, byte for byte (deterministic_mode).

    python benchmarks/goodput_soak.py [--minutes 5] [--kill-every 60] [--stop-every 0] [--save-interval 50]
                                      [--watchdog-timeout 5] [--fork-ranks 1] [--seed 1] [--train build/bin/train]

Both runs start their ranks as forks of the launcher (train --fork-ranks, docs/distributed.md#ranks-as-forks), which
spares each start and restart the program's start-up; --fork-ranks 0 measures ranks started as new programs.

The uninterrupted run is measured first, for the same number of steps (about --minutes long), then the interrupted
one: the whole benchmark takes about twice --minutes. Needs mosaicml-streaming (the machine-wide venv) to write the
tiny dataset. Exit status 1 when the final weights differ or the job fails.
"""
import argparse
import json
import os
import pathlib
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_json  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]

RECIPE = """
max_seq_len: 32
seed: 3
model: {{name: mpt_causal_lm, d_model: 64, n_heads: 4, n_layers: 2, expansion_ratio: 4, max_seq_len: 32,
        vocab_size: 64, no_bias: true, attn_config: {{attn_impl: torch}}}}
tokenizer: {{name: unused}}
train_loader: {{name: text, dataset: {{local: {data}, split: train, shuffle: true, max_seq_len: 32}}, drop_last: true}}
eval_loader: {{name: text, dataset: {{local: {data}, split: val, shuffle: false, max_seq_len: 32}}, drop_last: false}}
eval_interval: 0ba
optimizer: {{name: decoupled_adamw, lr: 0.003, weight_decay: 0.0001}}
scheduler: {{name: cosine_with_warmup, t_warmup: 20ba}}
max_duration: 100ba
global_train_batch_size: 16
device_train_microbatch_size: 8
device_eval_batch_size: 8
precision: fp32
device: cpu
deterministic_mode: true
autoresume: true
fsdp_config: {{sharding_strategy: FULL_SHARD}}
log_to_console: false
loggers: {{jsonl: {{filename: "{work}/runs/{{run_name}}/metrics.jsonl"}}}}
callbacks: {{hf_checkpointer: {{save_folder: "{work}/runs/{{run_name}}", save_interval: 1000000ba}}}}
"""


def write_split(path, n, seed):
    """n samples of 33 tokens < 64 with a learnable pattern (tests/unit/tiny_data.h's write_token_split)."""
    from streaming import MDSWriter
    with MDSWriter(out=str(path), columns={"tokens": "ndarray:int32"}) as w:
        for i in range(n):
            t = [(i * 7 + seed) % 64]
            for _ in range(32):
                t.append((3 * t[-1] + i % 5) % 64)
            w.write({"tokens": np.array(t, dtype=np.int32)})


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rank_pids(launcher):
    """{rank: pid} of the launcher's children: by their RANK, or, for ranks forked from the launcher (--fork-ranks,
    whose /proc/PID/environ is the launcher's), by the order they started in (the launcher starts them in rank
    order)."""
    children = []  # (start time, pid, RANK or None)
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) != launcher:
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        rank = next((int(kv[5:]) for kv in env if kv.startswith(b"RANK=")), None)
        children.append((int(fields[19]), int(d.name), rank))
    if all(rank is not None for _, _, rank in children):
        return {rank: pid for _, pid, rank in children}
    return {i: pid for i, (_, pid, _) in enumerate(sorted(children))}


class Job:
    """A `train` job on 2 ranks; follows its metrics.jsonl and records when each step line arrived."""

    def __init__(self, args, work, name, steps, supervised, extra=(), flags=()):
        """`extra`: recipe overrides; `flags`: more options for `train` (e.g. --plugin PATH)."""
        self.metrics = work / "runs" / name / "metrics.jsonl"
        self.log = work / f"{name}.log"
        cmd = [args.train, *flags]
        if supervised:
            cmd += ["--max-restarts", "1000", "--watchdog-timeout", str(args.watchdog_timeout)]
        for flag in ("fork_ranks", "bind_cores"):  # (as the caller's namespace has them)
            if getattr(args, flag, 0):
                cmd.append("--" + flag.replace("_", "-"))
        cmd += ["--recipe", str(work / "soak.yaml"), "--nproc-per-node", "2", "--master-port", str(free_port()),
                f"run_name={name}", f"max_duration={steps}ba", f"save_folder={work / 'ckpt' / name}",
                f"save_interval={args.save_interval}ba", *extra]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.offset = 0
        self.lines = []  # (arrival time, batch index before the step)

    def poll(self):
        try:
            with open(self.metrics, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        now = time.monotonic()
        for line in data[:end].split(b"\n"):
            j = json.loads(line)
            if "loss/train/total" in j:
                self.lines.append((now, j["batch"]))
        self.offset += end + 1

    def wait(self, until=None):
        """Polls until the job ends (True) or `until` passes (False)."""
        while True:
            self.poll()
            if self.proc.poll() is not None:
                self.poll()
                return True
            if until is not None and time.monotonic() >= until:
                return False
            time.sleep(0.01)


def weights(work, name, steps):
    p = work / "runs" / name / "huggingface" / f"ba{steps}" / "model.safetensors"
    return p.read_bytes() if p.exists() else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="about how long the uninterrupted run trains")
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between interruptions")
    ap.add_argument("--stop-every", type=int, default=0,
                    help="every N-th interruption is a SIGSTOP (caught by the watchdog) instead of kill -9; 0: none")
    ap.add_argument("--save-interval", type=int, default=50, help="batches between checkpoints")
    ap.add_argument("--watchdog-timeout", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fork-ranks", type=int, choices=(0, 1), default=1,
                    help="1: the ranks start as forks of the launcher (train --fork-ranks), 0: as new programs")
    ap.add_argument("--dump", help="write the step lines' arrival times and the interruptions here (JSON)")
    ap.add_argument("--train", default=str(pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin"))
                                           / "train"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tessera-soak-"))
    write_split(work / "data" / "train", 4096, 1)
    write_split(work / "data" / "val", 64, 2)
    (work / "soak.yaml").write_text(RECIPE.format(data=work / "data", work=work))

    # Calibrate: seconds per step, from a short uninterrupted run.
    cal = Job(args, work, "calibrate", 200, False)
    cal.wait()
    if cal.proc.returncode != 0 or len(cal.lines) < 100:
        sys.exit(f"the calibration run failed:\n{cal.log.read_text()[-3000:]}")
    per_step = (cal.lines[-1][0] - cal.lines[10][0]) / (len(cal.lines) - 11)
    steps = max(200, int(args.minutes * 60 / per_step))
    print(f"soak: {per_step * 1e3:.1f} ms per step; {steps} steps (~{args.minutes:g} min uninterrupted), "
          f"an interruption every {args.kill_every:g} s", flush=True)

    ref = Job(args, work, "reference", steps, False)
    ref.wait()
    ref_wall = time.monotonic() - ref.started
    if ref.proc.returncode != 0:
        sys.exit(f"the uninterrupted run failed:\n{ref.log.read_text()[-3000:]}")
    ref_step = (ref.lines[-1][0] - ref.lines[0][0]) / (len(ref.lines) - 1)
    print(f"uninterrupted: {ref_wall:.1f} s, {ref_step * 1e3:.2f} ms per step", flush=True)

    job = Job(args, work, "soak", steps, True)
    events = []  # (kind, rank, time, last batch logged before it)
    next_at = job.started + args.kill_every
    while not job.wait(until=next_at):
        pids = rank_pids(job.proc.pid)
        if len(pids) < 2 or not job.lines:
            next_at = time.monotonic() + 0.5  # between attempts: try again shortly
            continue
        rank = rng.randrange(2)
        kind = "SIGSTOP" if args.stop_every and (len(events) + 1) % args.stop_every == 0 else "kill -9"
        last = job.lines[-1][1]
        os.kill(pids[rank], signal.SIGSTOP if kind == "SIGSTOP" else signal.SIGKILL)
        events.append((kind, rank, time.monotonic(), last, len(job.lines)))
        print(f"  {kind} rank {rank} after batch {last + 1}", flush=True)
        next_at = time.monotonic() + args.kill_every
    wall = time.monotonic() - job.started
    ok = job.proc.returncode == 0
    same = ok and weights(work, "soak", steps) is not None and weights(work, "soak", steps) == weights(
        work, "reference", steps)

    # Per interruption: the first step line of the next attempt (a batch at or before the one last logged).
    rows = []
    for kind, rank, at, last, seen in events:
        after = [(t, b) for t, b in job.lines[seen:] if t > at]
        first = next(((t, b) for t, b in after if b <= last), None)
        if first is None:
            continue
        rows.append({"kind": kind, "rank": rank, "latency": first[0] - at, "lost": last + 1 - first[1]})
    # Goodput against the job's own step time: the mean of its one-batch step intervals (saves included, as in the
    # uninterrupted run), leaving out the intervals an interruption falls in. The two runs' step times differ by up
    # to 10% on a busy 2-core machine, which swamps what interruptions cost when one is compared with the other.
    kill_times = [at for _, _, at, _, _ in events]
    own = [t1 - t0 for (t0, b0), (t1, b1) in zip(job.lines, job.lines[1:])
           if b1 == b0 + 1 and not any(t0 < at <= t1 for at in kill_times)]
    own_step = statistics.mean(own) if own else ref_step
    goodput = steps * own_step / wall
    cross_run = steps * ref_step / wall
    startup = job.lines[0][0] - job.started if job.lines else float("nan")
    # Whether steps run slower after a restart (a cost the accounting below would miss): the first 500 step lines
    # of each new attempt against the job's own step time.
    after_restart = 0.0
    for kind, rank, at, last, seen in events:
        new = [(t, b) for t, b in job.lines[seen:] if t > at][:500]
        if len(new) > 1:
            after_restart += (new[-1][0] - new[0][0]) - (len(new) - 1) * own_step
    print(f"  the first 500 steps after the restarts took {after_restart:+.1f} s in all beyond the job's own step time")
    if args.dump:
        pathlib.Path(args.dump).write_text(json.dumps({"ref": ref.lines, "job": job.lines, "events": events,
                                                       "ref_started": ref.started, "job_started": job.started}))
    restarts = len(re.findall(r"\[launch\] restart \d+/", job.log.read_text()))
    restart_lost = sum(r["latency"] for r in rows)
    retrained = sum(r["lost"] for r in rows) * own_step
    print(f"  lost: {startup:.1f} s before the first step, {restart_lost:.1f} s from the kills to the restarted "
          f"attempts' first steps, {retrained:.1f} s retraining steps since the checkpoints resumed from; "
          f"{wall - steps * own_step:.1f} s in all")
    print(f"interrupted: {wall:.1f} s, {len(events)} interruptions, {restarts} restarts, exit {job.proc.returncode}, "
          f"final weights {'equal to' if same else 'DIFFER from'} the uninterrupted run's")
    for kind in ("kill -9", "SIGSTOP"):
        rs = [r for r in rows if r["kind"] == kind]
        if rs:
            lat = [r["latency"] for r in rs]
            print(f"  {kind}: {len(rs)}, restart latency median {statistics.median(lat):.2f} s "
                  f"(max {max(lat):.2f} s), steps lost per interruption mean "
                  f"{statistics.mean(r['lost'] for r in rs):.1f}")
    print(f"goodput: {100 * goodput:.1f}% (productive step time at the job's own {1e3 * own_step:.2f} ms per step / "
          f"wall time); at the uninterrupted run's {1e3 * ref_step:.2f} ms per step: {100 * cross_run:.1f}%; "
          f"uninterrupted / interrupted wall time: {100 * ref_wall / wall:.1f}%")
    lat = [r["latency"] for r in rows]
    bench_json.emit("goodput_soak", [{
        "case": f"2 ranks, interruption every {args.kill_every:g} s" +
                (f", every {args.stop_every}th a SIGSTOP" if args.stop_every else ""),
        "unit": "% goodput", "tessera": 100 * goodput, "peers": {},
        "restart_latency_median_s": statistics.median(lat) if lat else None,
        "restart_latency_max_s": max(lat) if lat else None,
        "steps_lost_mean": statistics.mean(r["lost"] for r in rows) if rows else None,
        "goodput_cross_run_percent": 100 * cross_run, "own_step_ms": 1e3 * own_step,
        "lost_startup_s": startup, "lost_restarts_s": restart_lost, "lost_retrained_s": retrained,
        "interruptions": len(events), "wall_s": wall, "uninterrupted_wall_s": ref_wall,
        "step_ms": 1e3 * ref_step, "final_weights_equal": same}])
    if not same:
        print(job.log.read_text()[-3000:])
        sys.exit(1)
    subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    main()
