# Sourced by bbc.sh, pack.sh and unpack.sh: the lease's paths and python, the kit's environment, and alive PID.
# The defaults are the GPU machine's; tests/test_lease_scripts.py rehearses the scripts on the CPU by pointing
# GDR_LEASE_BOOT at a stand-in boot file, GDR_LEASE_RUNS at a temporary folder and GDR_LEASE_PY at its python.
boot=${GDR_LEASE_BOOT:-/tmp/gdr-stash/boot.sh}  # ../shared/device/boot.sh, copied there by the kit's calls
runs=${GDR_LEASE_RUNS:-/tmp/gdr-runs}           # the run folder ($runs/bbc), its log, pid and plan
py=${GDR_LEASE_PY:-python3}                     # the image's python (boot.sh puts the kit on its path)
run=$runs/bbc; out=${OUT:-$runs/out}
source "$boot" || return 3

# Whether process PID still runs. kill -0 alone also answers yes for a process that ended and was not reaped (a
# zombie): a later call's run is no child of that call, and whether the machine's init reaps orphans is not ours to
# know; /proc/PID/stat's state field says Z for a zombie.
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  s=${s##*) }; [ "${s%% *}" != Z ]
}
