#!/bin/sh
# A stand-in for nvidia-smi on a simulated node, for the GPU reset rung. Its first argument is
# the node's directory; the rest are nvidia-smi's. It reads the node's state from files there:
#   gpus                  "INDEX PCI_BUS_ID" per GPU nvidia-smi lists
#   gpu-INDEX-busy        PIDs using the GPU, one a line (a reset is refused)
#   gpu-INDEX-persistence persistence mode is on (a reset is refused)
#   gpu-INDEX-bad         the GPU needs a reset: its fields read "[GPU requires reset]"
#   gpu-INDEX-stuck       a reset fails, as on a GPU that will not come back
# and answers the few queries the agent's gpu-reset endpoint makes, as nvidia-smi prints them.
dir=$1
shift
case "$1" in
  --query-gpu=index,pci.bus_id,persistence_mode)
    while read -r index bus; do
      [ -n "$index" ] || continue
      if [ -e "$dir/gpu-$index-persistence" ]; then mode=Enabled; else mode=Disabled; fi
      if [ -e "$dir/gpu-$index-bad" ]; then mode='[GPU requires reset]'; fi
      echo "$index, 0000$bus.0, $mode"
    done < "$dir/gpus"
    ;;
  --query-compute-apps=pid,gpu_bus_id)
    while read -r index bus; do
      [ -e "$dir/gpu-$index-busy" ] || continue
      # Like the driver, only processes that are still alive hold the GPU.
      while read -r pid; do [ -n "$pid" ] && [ -d "/proc/$pid" ] && echo "$pid, 0000$bus.0"; done < "$dir/gpu-$index-busy"
    done < "$dir/gpus"
    ;;
  --gpu-reset)
    [ "$2" = "-i" ] || { echo "usage: --gpu-reset -i INDEX" >&2; exit 2; }
    index=$3
    grep -q "^$index " "$dir/gpus" || { echo "No devices were found" >&2; exit 6; }
    busy=
    if [ -e "$dir/gpu-$index-busy" ]; then
      while read -r pid; do [ -n "$pid" ] && [ -d "/proc/$pid" ] && busy=1; done < "$dir/gpu-$index-busy"
    fi
    if [ -n "$busy" ]; then
      echo "The following GPUs could not be reset:" >&2
      echo "  GPU $index: In use by another client" >&2
      exit 255
    fi
    if [ -e "$dir/gpu-$index-stuck" ]; then
      echo "GPU $index: Unable to reset this GPU: Unknown Error" >&2
      exit 255
    fi
    rm -f "$dir/gpu-$index-bad"
    echo "GPU $(grep "^$index " "$dir/gpus" | cut -d' ' -f2) was successfully reset."
    echo "$index" >> "$dir/resets"
    ;;
  *)
    echo "fake nvidia-smi: unsupported arguments: $*" >&2
    exit 2
    ;;
esac
