"""The launchers users start Tessera with, as they are (docs/distributed.md#launching):

- the real `torchrun` (PyTorch's elastic agent, c10d rendezvous backend, its own store): `torchrun --standalone
  --nproc-per-node 2 --no-python train ...` trains with the same losses as Tessera's own launcher, and under
  `--max-restarts 1` a rank killed with SIGKILL mid-run is restarted by torchrun and the job resumes (autoresume) to
  final weights byte-identical to the uninterrupted run's;
- a Kubeflow PyTorchJob's pods: each rank gets only MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (no local-size
  variables). The ranks find out which of them share a machine through the rendezvous. On one machine they are one
  node of two ranks (equal to the launcher's 2-rank run); in two network namespaces joined by a veth pair (two pods,
  addresses on that private link only, no shared loopback) they are two nodes of one rank, Gloo binds the address that
  reaches MASTER_ADDR, and they train equal to two launchers run with `--nnodes 2`;
- Slurm: Debian's slurmctld, slurmd and munge started here (one node on loopback), the shipped sbatch script
  (tools/slurm_train.sbatch) running 2 ranks through srun; preempted with `scancel --signal=USR1`, the job saves,
  exits 75, requeues itself and resumes to the uninterrupted run's losses and final weights.
"""
import getpass
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from conftest import _binary, write_sequence_mds

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEQ, VOCAB, STEPS = 32, 128, 12


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch-data")
    write_sequence_mds(root / "train", 256, SEQ, VOCAB)
    return root


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, data):
    runs = tmp_path_factory.mktemp("launch-runs")
    r = {
        "max_seq_len": SEQ, "seed": 3, "tokenizer": {"name": "unused"},
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": SEQ, "vocab_size": VOCAB, "attn_config": {"attn_impl": "torch"}},
        "train_loader": {"name": "text", "dataset": {"local": str(data), "split": "train", "shuffle": True,
                                                     "max_seq_len": SEQ}, "drop_last": True},
        "optimizer": {"name": "decoupled_adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                      "weight_decay": 0.0},
        "scheduler": {"name": "cosine_with_warmup", "t_warmup": "2ba"},
        "max_duration": f"{STEPS}ba", "eval_interval": 0, "global_train_batch_size": 8,
        "device_train_microbatch_size": 4, "device_eval_batch_size": 8, "precision": "fp32", "device": "cpu",
        "deterministic_mode": True, "log_to_console": False, "dist_timeout": 120,
        "fsdp_config": {"sharding_strategy": "FULL_SHARD"},
        "save_folder": f"{runs}/{{run_name}}/ckpt", "save_interval": "2ba", "autoresume": True,
        "loggers": {"jsonl": {"filename": f"{runs}/{{run_name}}/metrics.jsonl"}},
        "callbacks": {"hf_checkpointer": {"save_folder": f"{runs}/{{run_name}}", "save_interval": f"{STEPS}ba"}},
    }
    path = runs / "recipe.yaml"
    path.write_text(yaml.safe_dump(r))
    return path, runs


def losses(runs, name):
    rows = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
    by_step = {}
    for row in rows:  # a resumed run logs the steps after its checkpoint again: the last value of each step counts
        if "loss/train/total" in row:
            by_step[row["batch"]] = row["loss/train/total"]
    return [by_step[s] for s in sorted(by_step)]


def weights(runs, name, steps=STEPS):
    return (runs / name / "huggingface" / f"ba{steps}" / "model.safetensors").read_bytes()


def run(cmd, env=None, timeout=600):
    proc = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc


def clean_env():
    """This environment without any launcher's variables (the test sets those it means), and one thread per rank
    under every launcher (as torchrun sets it; a pod has its own CPU limit), so that the runs compute alike."""
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
            "TORCHELASTIC_USE_AGENT_STORE", "GLOO_SOCKET_IFNAME"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    return {**env, "OMP_NUM_THREADS": "1"}


def free_port(addr="127.0.0.1"):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


TORCHRUN = pathlib.Path(sys.executable).parent / "torchrun"


@pytest.fixture(scope="module")
def reference(recipe):
    """Tessera's own launcher, 2 ranks on one node: the run every launcher here must reproduce."""
    path, runs = recipe
    run([_binary("TESSERA_TRAIN_BIN", "train"), "--recipe", path, "--nproc-per-node", 2, "--master-port", 0,
         "run_name=launcher"], env=clean_env())
    assert len(losses(runs, "launcher")) == STEPS
    return "launcher"


# Runs that a test interrupts once their metrics show a few steps (polling the file): the STEPS of the other tests take
# about 0.1 s on a fast host, less than a launcher's start, the poll and a signal together, so these run long enough to
# be caught mid-run on any machine, against an uninterrupted launcher run of the same length.
LONG_STEPS = 200
LONG = [f"max_duration={LONG_STEPS}ba", "save_interval=10ba", f"callbacks.hf_checkpointer.save_interval={LONG_STEPS}ba"]


@pytest.fixture(scope="module")
def long_reference(recipe):
    path, runs = recipe
    run([_binary("TESSERA_TRAIN_BIN", "train"), "--recipe", path, "--nproc-per-node", 2, "--master-port", 0,
         "run_name=launcher_long", *LONG], env=clean_env())
    assert len(losses(runs, "launcher_long")) == LONG_STEPS
    return "launcher_long"


def test_torchrun_trains_as_the_launcher_does(recipe, reference):
    path, runs = recipe
    assert TORCHRUN.exists(), f"{TORCHRUN} is missing (tools/setup.sh installs torch in the venv)"
    proc = run([TORCHRUN, "--standalone", "--nproc-per-node", 2, "--no-python",
                _binary("TESSERA_TRAIN_BIN", "train"), "--recipe", path, "run_name=torchrun"], env=clean_env())
    assert losses(runs, "torchrun") == losses(runs, reference)
    assert weights(runs, "torchrun") == weights(runs, reference)
    # Under torchrun's agent store, rank 0 does not serve one of its own.
    assert "rank 1 of 2 (node 0, local rank 1)" in proc.stderr, proc.stderr[-3000:]


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = pathlib.Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += map(int, kids)
        todo += map(int, kids)
    return out


def rank_pid(root, rank):
    for p in descendants(root):
        try:
            env = pathlib.Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
            exe = os.readlink(f"/proc/{p}/exe")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and exe.endswith(("/train", "/tessera")):  # bin/train runs tessera
            return p
    return None


def test_torchrun_restarts_a_killed_rank_and_the_job_resumes_bitwise(recipe, long_reference):
    path, runs = recipe
    reference = long_reference
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", 2, "--max-restarts", 1, "--monitor-interval", "0.2",
           "--no-python", _binary("TESSERA_TRAIN_BIN", "train"), "--recipe", path, "run_name=torchrun_kill", *LONG]
    proc = subprocess.Popen([str(c) for c in cmd], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    killed = None
    deadline = time.monotonic() + 600
    metrics = runs / "torchrun_kill" / "metrics.jsonl"
    while proc.poll() is None and time.monotonic() < deadline and killed is None:
        done = metrics.read_text().count('"loss/train/total"') if metrics.exists() else 0
        pid = rank_pid(proc.pid, 1) if done >= 15 else None  # past the checkpoint at batch 10
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed = (pid, done)
        time.sleep(0.05)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-2000:] + err[-4000:]
    assert killed is not None, "the job ended before rank 1 could be killed"
    # torchrun saw the rank die and started the group again; the new ranks resumed from a checkpoint (not from
    # step 0) and ended where the uninterrupted run did.
    assert "failed (exitcode: " in err, err[-3000:]  # torchrun names the first rank it saw fail (either one)
    assert "] resumed from " in err, err[-3000:]
    assert losses(runs, "torchrun_kill") == losses(runs, reference)
    assert weights(runs, "torchrun_kill", LONG_STEPS) == weights(runs, reference, LONG_STEPS)


def pytorchjob_env(rank, addr, port):
    """What a Kubeflow PyTorchJob pod gets: the master's address and port, the world size and its rank; nothing
    says which ranks share a machine."""
    return {**clean_env(), "MASTER_ADDR": addr, "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(rank)}


def test_pytorchjob_ranks_on_one_machine_find_they_share_it(recipe, reference):
    path, runs = recipe
    port = free_port()
    procs = [subprocess.Popen([_binary("TESSERA_TRAIN_BIN", "train"), "--recipe", str(path), "run_name=pods_local"],
                              env=pytorchjob_env(r, "127.0.0.1", port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert "rank 1 of 2 (node 0, local rank 1" in outs[1][1], outs[1][1][-3000:]
    assert losses(runs, "pods_local") == losses(runs, reference)
    assert weights(runs, "pods_local") == weights(runs, reference)


class Pods:
    """Two network namespaces joined by a veth pair: two "pods" at 10.211.0.1 and 10.211.0.2, each with its own
    loopback, reaching each other only over that link."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.ns = [f"tsr{tag}a", f"tsr{tag}b"]
        self.addr = ["10.211.0.1", "10.211.0.2"]
        self.created = []
        steps = [["ip", "netns", "add", self.ns[0]], ["ip", "netns", "add", self.ns[1]],
                 ["ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b"]]
        for i in range(2):
            steps += [["ip", "link", "set", f"v{tag}{'ab'[i]}", "netns", self.ns[i]],
                      ["ip", "-n", self.ns[i], "addr", "add", f"{self.addr[i]}/24", "dev", f"v{tag}{'ab'[i]}"],
                      ["ip", "-n", self.ns[i], "link", "set", f"v{tag}{'ab'[i]}", "up"],
                      ["ip", "-n", self.ns[i], "link", "set", "lo", "up"]]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True)
            if proc.returncode != 0:
                self.close()
                raise PermissionError(f"{' '.join(step)}: {proc.stderr.strip()}")
            if step[1:3] == ["netns", "add"]:
                self.created.append(step[3])

    def close(self):
        for ns in self.created:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []


def test_pytorchjob_pods_in_two_network_namespaces_train_as_two_nodes(recipe):
    path, runs = recipe
    train = _binary("TESSERA_TRAIN_BIN", "train")
    # The reference: two launchers on this machine, one node each (--nnodes 2).
    port = free_port()
    nodes = [subprocess.Popen([train, "--recipe", str(path), "--nnodes", "2", "--node-rank", str(n),
                               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "run_name=two_nodes"], env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in range(2)]
    for p in nodes:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
    try:
        pods = Pods()
    except (PermissionError, FileNotFoundError) as e:
        pytest.skip(f"cannot create network namespaces here (needs root and iproute2): {e}")
    try:
        port = 29611
        procs = [subprocess.Popen(["ip", "netns", "exec", pods.ns[r], train, "--recipe", str(path),
                                   "run_name=pods_netns"], env=pytorchjob_env(r, pods.addr[0], port),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        pods.close()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert "rank 1 of 2 (node 1, local rank 0" in outs[1][1], outs[1][1][-3000:]
    assert losses(runs, "pods_netns") == losses(runs, "two_nodes")
    assert weights(runs, "pods_netns") == weights(runs, "two_nodes")


class SlurmCluster:
    """A one-node Slurm cluster of Debian's daemons on loopback: munged with a key of its own, slurmctld and slurmd
    with a config written here (ports free now, state and logs in `root`). SLURM_CONF in `env` points the client
    commands (sbatch, scontrol, scancel) at it."""

    DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel")

    def __init__(self, root):
        self.root = root
        user = getpass.getuser()
        (root / "state").mkdir()
        (root / "spool").mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = root / "munge.sock"
        subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                        f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
                        f"--seed-file={root / 'munge.seed'}"], check=True, timeout=30)
        conf = root / "slurm.conf"
        conf.write_text(f"""ClusterName=tessera
SlurmctldHost=localhost(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'slurmctld.log'}
SlurmdLogFile={root / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        self.env = {**clean_env(), "SLURM_CONF": str(conf)}
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=self.env, timeout=30)
        subprocess.run(["slurmd", "-f", str(conf), "-N", "localhost"], check=True, env=self.env, timeout=30)
        deadline = time.time() + 60
        while "idle" not in self.cmd("sinfo", "-h", "-o", "%T", check=False):
            if time.time() > deadline:
                raise RuntimeError(f"the Slurm node did not come up: {self.logs()}")
            time.sleep(0.2)

    def cmd(self, *args, check=True):
        proc = subprocess.run(list(map(str, args)), env=self.env, capture_output=True, text=True, timeout=60)
        if check:
            assert proc.returncode == 0, f"{args}: {proc.stderr}"
        return proc.stdout

    def job(self, job_id):
        """scontrol's fields of the job: JobState, Restarts, Reason, ..."""
        fields = self.cmd("scontrol", "show", "job", "-o", job_id).split()
        return dict(f.split("=", 1) for f in fields if "=" in f)

    def logs(self):
        return "".join(f"\n== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self):
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.root / f"{name}.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [d for d in SlurmCluster.DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing; tools/setup_tests.sh installs slurmctld, "
                    "slurmd, slurm-client and munge)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def test_slurm_job_preempted_with_usr1_requeues_and_ends_bitwise(recipe, long_reference, slurm):
    """The shipped sbatch script (tools/slurm_train.sbatch) runs 2 ranks through srun. `scancel --signal=USR1` after
    a few steps: every rank saves and exits 75, the script requeues the job, the requeued job (same id, restart 1)
    resumes from that checkpoint, and its losses and final weights equal the uninterrupted launcher run's."""
    path, runs = recipe
    reference = long_reference
    out = runs / "slurm.out"
    job = slurm.cmd("sbatch", "--parsable", "--ntasks=2", f"--output={out}",
                    f"--export=ALL,TESSERA_TRAIN={_binary('TESSERA_TRAIN_BIN', 'train')}",
                    ROOT / "tools" / "slurm_train.sbatch", "--recipe", path, "run_name=slurm",
                    *LONG).strip().split(";")[0]
    metrics = runs / "slurm" / "metrics.jsonl"
    deadline = time.time() + 300
    while (metrics.read_text().count('"loss/train/total"') if metrics.exists() else 0) < 3:
        assert time.time() < deadline, f"no progress: {out.read_text() if out.exists() else ''}{slurm.logs()}"
        time.sleep(0.05)
    slurm.cmd("scancel", "--signal=USR1", job)
    # The script requeues the job; a requeued job waits (Slurm's requeue delay): once it is pending again, let it
    # start now. (While the first run's batch script ends, scontrol may show the job FAILED or COMPLETING with its
    # restart already counted: only PENDING means requeued.)
    while not (slurm.job(job).get("Restarts", "0") != "0" and slurm.job(job)["JobState"] == "PENDING"):
        assert time.time() < deadline, f"not requeued: {out.read_text()}{slurm.job(job)}{slurm.logs()}"
        time.sleep(0.2)
    # slurmd refuses a step whose credential is not newer than the revocation of the run it just killed, at one-second
    # resolution ("Job credential revoked": a start in the same second as the requeue fails the job). Slurm's own
    # requeue delay avoids that; forcing the start ourselves, we let the clock pass the requeue's second first.
    time.sleep(2.0)
    slurm.cmd("scontrol", "update", f"JobId={job}", "StartTime=now")
    while out.read_text().count("[slurm] the ranks exited") < 2 or \
            slurm.job(job)["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED"):
        assert time.time() < deadline, f"did not finish: {out.read_text()}{slurm.job(job)}{slurm.logs()}"
        time.sleep(0.2)
    log = out.read_text()
    assert slurm.job(job)["JobState"] == "COMPLETED", log[-4000:]
    assert "received SIGUSR1" in log and "the ranks exited 75" in log and "requeueing job" in log, log[-4000:]
    assert f"job {job}, restart 1: 2 ranks" in log and "resumed from" in log, log[-4000:]
    assert losses(runs, "slurm") == losses(runs, reference)
    assert weights(runs, "slurm", LONG_STEPS) == weights(runs, reference, LONG_STEPS)
