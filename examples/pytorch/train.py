"""A small data-parallel PyTorch training job that steadfast can protect (docs/lab.md).

DDP on CPU with the gloo backend, a tiny model on synthetic data, so it runs anywhere PyTorch
does (Debian: `apt-get install python3-torch`, then /usr/bin/python3). What it shows is the
training side of steadfast, through clients/python/steadfast_client.py:

  - each rank pushes its step metrics, with its own compute time per iteration, to the agent;
  - every --checkpoint-every iterations each rank saves its shard with torch.save and reports it;
  - at start it resumes from the controller's restore plan, or from the newest step for which
    every rank's shard is on disk when that is newer (or there is no controller);
  - it follows the controller's micro-batch plan when the job was registered with one;
  - `kill -USR1 <pid>` writes the rank's Python stacks to a file (faulthandler), no py-spy needed;
  - with --hot-swap (clients/python/steadfast_hotswap.py), every step's state is kept in memory
    and at a replica holder, and a spare node's process takes a failed node's rank in place.

Launch with one task per rank; the rank and world come from Slurm (or torchrun's RANK and
WORLD_SIZE), or with --hot-swap from the controller's world. examples/pytorch/train.sbatch does
it with srun.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

from steadfast_client import SteadfastClient  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", default=os.environ.get("STEADFAST_JOB") or os.environ.get("SLURM_JOB_NAME") or "pytorch-example",
                        help="the job's name in steadfast (default: $STEADFAST_JOB, else $SLURM_JOB_NAME)")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--checkpoint-every", type=int, default=20, metavar="K")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("STEADFAST_CHECKPOINT_DIR"),
                        help="shared by all ranks (default: $STEADFAST_CHECKPOINT_DIR, else ./checkpoints/JOB)")
    parser.add_argument("--checkpoint-tier", default="remote", choices=["gpu", "host", "disk", "peer", "remote"],
                        help="how steadfast should count the saved shards: remote for a shared file system "
                             "(the default; a node's loss loses nothing), disk for node-local storage")
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per rank per iteration when steadfast has no plan")
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--step-sleep", type=float, default=0.05,
                        help="seconds of stand-in compute per micro-batch, so the tiny model trains at a watchable pace")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--hot-swap", action="store_true", default=os.environ.get("STEADFAST_HOT_SWAP") == "1",
                        help="hot swap (default: $STEADFAST_HOT_SWAP=1): every-step replicas in memory, spares take a "
                             "failed node's ranks (clients/python/steadfast_hotswap.py; needs $STEADFAST_RENDEZVOUS)")
    parser.add_argument("--width", type=int, default=64, help="hidden units of the model (its state grows with it: 136 bytes a unit)")
    return parser.parse_args()


def slurm_environment():
    """RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, from Slurm's variables where not set."""
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))
    if "MASTER_ADDR" not in env:
        first = "127.0.0.1"
        if env.get("SLURM_JOB_NODELIST"):
            # The first host of the allocation, expanded by Slurm itself (node-[1-4] → node-1).
            hosts = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True, timeout=10, check=False)
            first = (hosts.stdout.split() or [first])[0]
        env["MASTER_ADDR"] = first
    if "MASTER_PORT" not in env:
        # One port per job, so two jobs sharing a first node do not meet at the same rendezvous.
        env["MASTER_PORT"] = str(20000 + int(env.get("SLURM_JOB_ID", "9500")) % 20000)
    env["RANK"], env["WORLD_SIZE"] = str(rank), str(world)
    return rank, world


# c10d's TCP store gives up when a system call in its connect is interrupted ("Interrupted system
# call"), and a rank may knock before the master listens: the rendezvous is tried again then.
RENDEZVOUS_ATTEMPTS = 5
TRANSIENT_RENDEZVOUS = re.compile(r"Interrupted system call|Connection refused|Connection reset")


def rendezvous(dist, rank, world, say):
    for attempt in range(1, RENDEZVOUS_ATTEMPTS + 1):
        try:
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
            return
        except RuntimeError as error:
            if attempt == RENDEZVOUS_ATTEMPTS or not TRANSIENT_RENDEZVOUS.search(str(error)):
                raise
            say("rendezvous attempt %d of %d failed (%s); trying again" % (attempt, RENDEZVOUS_ATTEMPTS, error))
            time.sleep(1)


def shard_path(directory, step, rank):
    return os.path.join(directory, "step-%08d" % step, "rank-%d.pt" % rank)


def newest_complete_step(directory, world):
    """The newest step every rank saved (a crash mid-save leaves a step some ranks lack)."""
    if not os.path.isdir(directory):
        return None
    steps = sorted((int(name[5:]) for name in os.listdir(directory) if name.startswith("step-") and name[5:].isdigit()), reverse=True)
    for step in steps:
        if all(os.path.exists(shard_path(directory, step, rank)) for rank in range(world)):
            return step
    return None


def resume_from_disk(client, rank, world, checkpoint_dir, module, optimizer, say):
    """The first iteration to run: after the restore plan's step, or the newest complete one on disk."""
    import torch
    import torch.distributed as dist

    # Rank 0 chooses where to resume and tells the others, so that every rank agrees.
    start = torch.zeros(1, dtype=torch.long)
    if rank == 0:
        plan = client.restore_plan()
        disk = newest_complete_step(checkpoint_dir, world)
        planned = plan["step"] if plan and os.path.exists(shard_path(checkpoint_dir, plan["step"], 0)) else None
        # The plan names the newest step every rank can still load after evictions. Every shard
        # here is in one directory all ranks read, so a newer step every rank saved there loads
        # too: a run stopped right after saving may not have got its report to the controller.
        if planned is not None and (disk is None or planned >= disk):
            chosen, source = planned, "restore plan"
        elif disk is not None:
            chosen, source = disk, "newest complete step on disk" + ("" if planned is None else ", newer than the restore plan's %d" % planned)
        else:
            chosen, source = None, "nothing"
        start[0] = -1 if chosen is None else chosen
        say("resume: %s%s" % (source, "" if chosen is None else " → step %d" % chosen))
    # The plan also names, per rank, the cheapest surviving copy of its shard (`sources`); this
    # example keeps every shard in one shared directory, so the step is all it needs.
    dist.broadcast(start, src=0)
    if start.item() < 0:
        return 1
    state = torch.load(shard_path(checkpoint_dir, int(start.item()), rank))
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["iteration"] + 1


def train_iteration(job, iteration, model, first, before_sync=None):
    """One iteration: this rank's micro-batches, the gradient all-reduce, the step, its reports."""
    import torch

    args, client, rank, world, optimizer, say = job["args"], job["client"], job["rank"], job["world"], job["optimizer"], job["say"]
    iteration_started = time.perf_counter()
    # This rank's share of the iteration's micro-batches: the controller's plan when the
    # job has one (fail-slow mitigation moves work off a straggler), else an even share.
    plan = client.microbatches() if client.controller_url else None
    share = client.microbatch_share(rank, default=args.micro_batches, plan=plan) if plan else args.micro_batches
    total = int(plan["microbatches"]) if plan else args.micro_batches * world
    optimizer.zero_grad()
    started = time.perf_counter()
    losses = []
    with model.no_sync():
        for micro in range(share):
            data = torch.Generator().manual_seed(iteration * 100_003 + rank * 1009 + micro)
            x = torch.randn(args.micro_batch_size, 32, generator=data)
            y = x @ job["target"] + 0.01 * torch.randn(args.micro_batch_size, 1, generator=data)
            # Scaled so that DDP's average over ranks is the mean over all micro-batches.
            loss = torch.nn.functional.mse_loss(model(x), y) * world / total
            loss.backward()
            losses.append(loss.item() * total / world)
            if args.step_sleep:
                time.sleep(args.step_sleep)
    compute = time.perf_counter() - started
    if before_sync is not None:
        before_sync()  # hot swap: the previous step's replica is committed before this all-reduce
    # The gradient all-reduce, triggered by a zero-weight pass outside no_sync. Kept apart
    # from the timing above: waiting for the slowest rank would make every rank look as slow.
    (model(torch.zeros(1, 32)).sum() * 0).backward()
    optimizer.step()
    # The whole synchronous step, all-reduce included: the job's iteration time, the same on every rank.
    step_seconds = time.perf_counter() - iteration_started
    mean_loss = sum(losses) / len(losses) if losses else float("nan")
    client.push_step(iteration, iteration_seconds=compute, loss=mean_loss,
                     samples_per_second=share * args.micro_batch_size / max(compute, 1e-9))
    if iteration % args.log_every == 0 or iteration == first:
        say("iteration %d loss %.5f compute %.3fs step %.3fs micro-batches %d/%d" % (iteration, mean_loss, compute, step_seconds, share, total))
    if iteration % args.checkpoint_every == 0:
        path = shard_path(job["checkpoint_dir"], iteration, rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}, path + ".tmp")
        os.replace(path + ".tmp", path)  # a shard on disk is always whole
        client.report_checkpoint(iteration, tier=args.checkpoint_tier)
        say("checkpoint step %d saved to %s" % (iteration, path))


def build_model(torch, width):
    torch.manual_seed(0)  # every rank starts from the same weights, as DDP expects
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))


def main():
    args = parse_args()
    if args.hot_swap:
        return main_hot_swap(args)
    rank, world = slurm_environment()
    checkpoint_dir = args.checkpoint_dir or os.path.join(os.getcwd(), "checkpoints", args.job)
    client = SteadfastClient.from_env(job=args.job, rank=rank)
    stacks = client.enable_stack_dumps()
    say = lambda text: print("[rank %d] %s" % (rank, text), flush=True)  # noqa: E731

    import torch  # noqa: E402 - after the client, so a stack dump covers the slow import too
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    say("pid %d on %s, world %d, master %s:%s, stacks on SIGUSR1 to %s" % (os.getpid(), client.node, world, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], stacks))
    rendezvous(dist, rank, world, say)

    model = DistributedDataParallel(build_model(torch, args.width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    first = resume_from_disk(client, rank, world, checkpoint_dir, model.module, optimizer, say)
    job = {"args": args, "client": client, "rank": rank, "world": world, "optimizer": optimizer, "target": target, "checkpoint_dir": checkpoint_dir, "say": say}
    for iteration in range(first, args.iterations + 1):
        train_iteration(job, iteration, model, first)

    dist.barrier()
    client.close(2.0)
    say("done after iteration %d; steadfast client %s" % (args.iterations, client.stats))
    dist.destroy_process_group()


def main_hot_swap(args):
    """The same training under steadfast_hotswap: rank and world are the shard and the world of the
    controller's current epoch, a spare waits in join(), and a machine fault costs a swap, not a
    relaunch. A fresh start still resumes from disk (the fallback relaunch needs that)."""
    os.environ["STEADFAST_HOT_SWAP"] = "1"
    checkpoint_dir = args.checkpoint_dir or os.path.join(os.getcwd(), "checkpoints", args.job)
    client = SteadfastClient.from_env(job=args.job)

    import torch  # noqa: E402
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from steadfast_hotswap import HotSwap

    torch.set_num_threads(1)
    runtime = HotSwap.from_env(client, job=args.job, timeout=timedelta(seconds=120))
    joined = runtime.join()
    if joined is None:
        print("[spare] pid %d on %s: released, the job finished" % (os.getpid(), client.node), flush=True)
        client.close(1.0)
        return
    rank, world = joined
    client.rank = rank  # steps are reported under the shard's rank
    stacks = client.enable_stack_dumps()
    say = lambda text: print("[rank %d] %s" % (rank, text), flush=True)  # noqa: E731
    say("pid %d on %s, world %d, rendezvous %s:%d (epoch %d), stacks on SIGUSR1 to %s" % (os.getpid(), client.node, world, runtime.rendezvous[0], runtime.rendezvous[1], runtime.epoch, stacks))

    net = build_model(torch, args.width)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    # A spare joining a running job restores its shard from a replica in protect(); the others
    # of a fresh start resume from disk as without hot swap.
    first = 1 if runtime.swapped_in else resume_from_disk(client, rank, world, checkpoint_dir, net, optimizer, say)
    runtime.protect(net, optimizer, wrap=lambda module, group: DistributedDataParallel(module, process_group=group), first=first)
    job = {"args": args, "client": client, "rank": rank, "world": world, "optimizer": optimizer, "target": target, "checkpoint_dir": checkpoint_dir, "say": say}
    while runtime.iteration <= args.iterations:
        with runtime.step() as iteration:
            train_iteration(job, iteration, runtime.model, runtime.resume_step() + 1, before_sync=runtime.before_sync)

    dist.barrier()
    runtime.finish()
    client.close(2.0)
    say("done after iteration %d; steadfast client %s" % (args.iterations, client.stats))


if __name__ == "__main__":
    main()
