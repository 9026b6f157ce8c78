#!/bin/sh
# steadfast preflight as a Slurm Prolog: checks this node before a job starts there.
# Exit 0: the node is fit and the job starts. Exit 1: the check printed the fatal condition;
# slurmd fails the prolog, requeues the job and drains the node. See docs/deploy-slurm.md.
#
# STEADFAST_BIN: the command whose `check` runs. Unset: steadfast-agent (the agent's package,
#   which installs this script, and the quicker start), else steadfast (the full package), each
#   looked up on PATH and then in /usr/bin, since slurmd may run prologs with a short PATH.
# STEADFAST_PREFLIGHT_ARGS: further check options, e.g. "--expect-gpus 8"; Slurm gives the
#   prolog no arguments, so set it here or in the environment of slurmd.
# Arguments given to this script are passed on to the check as well.
set -u
node="${SLURMD_NODENAME:-$(hostname -s)}"
bin=${STEADFAST_BIN:-}
if [ -z "$bin" ]; then
  for candidate in steadfast-agent steadfast /usr/bin/steadfast-agent /usr/bin/steadfast; do
    if command -v "$candidate" >/dev/null 2>&1; then
      bin=$candidate
      break
    fi
  done
fi
if [ -z "$bin" ]; then
  echo "steadfast prolog: neither steadfast-agent nor steadfast is installed; set STEADFAST_BIN" >&2
  exit 1
fi
# Its own Xid state file: a HealthCheckProgram running the check keeps its own record, so each
# sees a new fatal Xid once.
# shellcheck disable=SC2086 # the options are words on purpose
exec $bin check --node "$node" \
  --xid.state-file /var/lib/steadfast/prolog-xid-state.json \
  ${STEADFAST_PREFLIGHT_ARGS:-} "$@"
