#!/usr/bin/env bash
# gpu-check.sh: checks libgpulimit on a real NVIDIA H100/H200 with nvcc.
# It is not part of CI (no GPU there); run it by hand on a GPU machine:
#
#   limiter/hook/gpu-check.sh            # from the repository root or anywhere
#
# Needs: an NVIDIA GPU and driver (libcuda.so.1, libnvidia-ml.so.1,
# nvidia-smi), nvcc (CUDA 12.x), gcc and make, and root (or unprivileged user
# namespaces): the production hook reads its slice only at the fixed in-pod
# paths, so each hooked run goes through build/podrun, which mounts a slice
# laid out by build/regionctl there (quota read-only), as in a pod. Optional:
# python3 with torch for the torch.cuda.mem_get_info check.
#
# It prints, in order:
#   1. the memory cap under cudaMalloc, cudaMallocAsync and cudaMalloc3DArray,
#      and cudaMemGetInfo showing the slice            (slice of MEM_MIB, default 4096)
#   2. torch.cuda.mem_get_info showing the slice        (skipped without torch)
#   3. the achieved SM share at 25 % and 50 %: spin-kernel throughput with the
#      hook divided by the throughput without it       (RUN_SECONDS each, default 10)
#   4. launch overhead: host ns per empty launch, native and hooked (50 % slice,
#      under its share), the difference and the ratio
#   5. the hostile-tenant checks on the real driver: the hook's old variables
#      set wider change nothing, dlmopen of the driver is refused, the driver
#      opened by its absolute path stays capped, and (shown, not a failure)
#      what a program that reads the driver's symbol table itself gets past
#      the hook: the node agent's NVML view catches that
#   6. MIG (read-only: it never switches MIG mode, which needs a GPU reset):
#      on a GPU whose MIG mode is on, the node agent's discovery on the real
#      driver (go test -tags gpu, limiter/agent/realgpu_test.go) reports every
#      MIG instance nvidia-smi -L lists, with its profile, memory and SMs; a
#      hooked process on the first instance (CUDA_VISIBLE_DEVICES=MIG-…, the
#      slice's GPU UUID the instance's) stays under the slice's memory cap.
#      Skipped, saying how to enable MIG, when MIG mode is off. Needs go.
#   7. MPS (MPS_PERCENT, default 25; MPS_MIB, default MEM_MIB): a real
#      nvidia-cuda-mps-control daemon in temporary pipe and log directories,
#      given the client limits with the node agent's own control commands
#      (limiter/agent/mps.go, mpsShape.commands); an MPS client cannot
#      allocate past the pinned limit, also with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
#      and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set wider in its environment (the
#      tenant cannot widen); its SM share with and without those variables is
#      printed (spin-kernel throughput over native); the daemon quits when
#      told. It leaves the GPU's compute mode as it is (the agent sets
#      EXCLUSIVE_PROCESS on an MPS GPU; that is checked on the mocks).
#      Skipped when nvidia-cuda-mps-control is not installed.
# and exits 1 if a cap is broken or a share misses its target by more than
# 5 points. Run it on an otherwise idle GPU (other work skews the shares) and
# outside a container: without the node agent, the hook's compute feedback
# needs NVML to report the process's own pid, which a pid namespace prevents.
set -euo pipefail

MEM_MIB=${MEM_MIB:-4096}
MPS_MIB=${MPS_MIB:-$MEM_MIB}
MPS_PERCENT=${MPS_PERCENT:-25}
SECONDS_PER_RUN=${RUN_SECONDS:-10}
BLOCK_US=${BLOCK_US:-200}
GPU_INDEX=${GPU_INDEX:-0}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

section() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*"; failed=1; }

require() {
	for tool in "$@"; do
		command -v "$tool" >/dev/null || { echo "gpu-check: $tool not found" >&2; exit 2; }
	done
}

build() {
	section "build"
	make -C "$here" -s build/libgpulimit.so build/podrun build/regionctl
	# cudaprog against the real driver (cuda_subset.h is the driver's ABI).
	gcc -std=c11 -O2 -I"$here/include" -I"$here/src" -o "$work/cudaprog" "$here/tests/cudaprog.c" "$here/src/elf.c" \
		-lcuda -lnvidia-ml -ldl -lpthread
	local arch
	arch=$(nvidia-smi -i "$GPU_INDEX" --query-gpu=compute_cap --format=csv,noheader | tr -d '.')
	nvcc -O2 -arch="sm_${arch}" -o "$work/gpu_check" "$here/tests/gpu_check.cu"
	nvidia-smi -i "$GPU_INDEX" --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader
}

# hooked PERCENT LIMIT_PERCENT CMD...: run CMD with the hook in a fresh
# slice of MEM_MIB, mounted at the fixed in-pod paths (extra environment in
# HOOKED_ENV, e.g. a tenant's own variables).
hooked() {
	local pct=$1 lim=$2
	shift 2
	local slice="$work/slice-$pct-$lim-$RANDOM"
	"$here/build/regionctl" "$slice" "$MEM_MIB" "$pct" "$lim" "${SLICE_GPU_UUID:-$GPU_UUID}"
	env CUDA_VISIBLE_DEVICES="${VISIBLE:-$GPU_INDEX}" GPUBROKER_LIMITER_LOG=warn ${HOOKED_ENV:-} \
		"$here/build/podrun" -q "$slice/quota" -u "$slice/usage" \
		env LD_PRELOAD="$here/build/libgpulimit.so" "$@"
}

native() {
	env CUDA_VISIBLE_DEVICES="$GPU_INDEX" "$@"
}

check_memory() {
	section "1. memory cap (slice ${MEM_MIB} MiB)"
	hooked 100 100 "$work/gpu_check" mem "$MEM_MIB" || failed=1
}

check_torch() {
	section "2. torch.cuda.mem_get_info"
	if ! python3 -c 'import torch' 2>/dev/null; then
		echo "skipped: python3 with torch not available"
		return
	fi
	local out
	out=$(hooked 100 100 python3 -c 'import torch; f, t = torch.cuda.mem_get_info(); print(f, t)')
	echo "torch.cuda.mem_get_info() = $out (free, total bytes)"
	[ "${out#* }" = "$((MEM_MIB * 1024 * 1024))" ] || fail "torch sees total ${out#* }, want $((MEM_MIB * 1024 * 1024))"
}

kernels_per_s() {
	sed -n 's/^spin kernels_per_s=\([0-9.]*\).*/\1/p'
}

check_share() {
	section "3. SM share (${SECONDS_PER_RUN} s of saturating ${BLOCK_US} us one-wave kernels per run)"
	local base
	base=$(native "$work/gpu_check" spin "$SECONDS_PER_RUN" "$BLOCK_US" | kernels_per_s)
	echo "native: $base kernels/s (100 %)"
	for pct in 25 50; do
		local got share
		got=$(hooked "$pct" "$pct" "$work/gpu_check" spin "$SECONDS_PER_RUN" "$BLOCK_US" | kernels_per_s)
		share=$(awk -v g="$got" -v b="$base" 'BEGIN { printf "%.1f", 100 * g / b }')
		echo "slice ${pct} %: $got kernels/s = ${share} % of native"
		awk -v s="$share" -v p="$pct" 'BEGIN { exit (s - p > 5 || p - s > 5) }' ||
			fail "share at ${pct} % is ${share} %, outside ±5 points"
	done
}

ns_per_launch() {
	sed -n 's/^launch ns_per_launch=\([0-9.]*\).*/\1/p'
}

check_launch() {
	section "4. launch overhead (empty kernels, host time)"
	local n=200000 nat hk
	nat=$(native "$work/gpu_check" launch "$n" | ns_per_launch)
	hk=$(hooked 50 50 "$work/gpu_check" launch "$n" | ns_per_launch)
	awk -v n="$nat" -v h="$hk" 'BEGIN { printf "native %.1f ns, hooked %.1f ns, added %.1f ns, ratio %.2f\n", n, h, h - n, h / n }'
}

# reply CMD: the CUresult of cudaprog's reply to CMD (its second word).
reply() {
	awk -v c="$1" '$1 == c { print $2; exit }'
}

check_tenant() {
	section "5. hostile tenant (real driver, slice ${MEM_MIB} MiB)"
	local bytes=$(((MEM_MIB + 1024) * 1024 * 1024)) out
	out=$(HOOKED_ENV="GPUBROKER_MEMORY_LIMIT_MIB=$((MEM_MIB * 16)) GPUBROKER_QUOTA_FILE=/tmp/none" \
		hooked 100 100 "$work/cudaprog" alloc linear "$bytes" , meminfo)
	echo "$out"
	[ "$(echo "$out" | reply alloc)" = 2 ] || fail "wider variables let ${bytes} bytes through a ${MEM_MIB} MiB slice"
	out=$(hooked 100 100 "$work/cudaprog" dlmopen libcuda.so.1 "$bytes" 2>&1)
	echo "$out"
	echo "$out" | grep -q '^dlmopen 800 0' || fail "dlmopen of the driver was not refused"
	local lib
	lib=$(ldconfig -p | awk '/libcuda\.so\.1 / { print $NF; exit }')
	out=$(hooked 100 100 "$work/cudaprog" -a "$lib" alloc linear "$bytes")
	echo "$out (driver by its path $lib)"
	[ "$(echo "$out" | reply alloc)" = 2 ] || fail "the driver opened by its path let ${bytes} bytes through"
	out=$(hooked 100 100 "$work/cudaprog" rawalloc "$bytes")
	echo "$out (the driver's table read by hand: past the hook; the node agent stops it)"
}

check_mig() {
	section "6. MIG (read-only)"
	local mode
	mode=$(nvidia-smi -i "$GPU_INDEX" --query-gpu=mig.mode.current --format=csv,noheader 2>/dev/null || echo "[N/A]")
	if [ "$mode" != "Enabled" ]; then
		echo "skipped: MIG mode is ${mode} on GPU ${GPU_INDEX}; gpubroker never switches it. To run this check:"
		echo "  nvidia-smi -i ${GPU_INDEX} -mig 1 (then a GPU reset), nvidia-smi mig -i ${GPU_INDEX} -cgi 3g.71gb,1g.18gb -C"
		return
	fi
	require go
	local uuids first
	# nvidia-smi -L lists each GPU, then its MIG devices indented beneath it.
	uuids=$(nvidia-smi -L | awk -v g="GPU ${GPU_INDEX}:" '
		/^GPU / { on = (index($0, g) == 1) }
		on && /MIG-/ { match($0, /MIG-[^)]*/); print substr($0, RSTART, RLENGTH) }')
	if [ -z "$uuids" ]; then
		fail "GPU ${GPU_INDEX} is in MIG mode with no MIG instance (make some: nvidia-smi mig -cgi ... -C)"
		return
	fi
	echo "nvidia-smi lists:" $uuids
	(cd "$here/../.." && GPUCHECK_MIG_UUIDS="$uuids" go test -tags gpu -count=1 -v -run '^TestRealGPUDiscovery$' ./limiter/agent/) ||
		fail "the agent's discovery on the real driver does not match nvidia-smi"
	first=$(echo "$uuids" | head -n 1)
	echo "hooked memory cap on MIG instance ${first}:"
	VISIBLE="$first" SLICE_GPU_UUID="$first" hooked 100 100 "$work/gpu_check" mem "$MEM_MIB" ||
		fail "the memory cap does not hold on MIG instance ${first}"
}

# mps CMD...: run CMD with the check's MPS daemon directories.
mps() {
	env CUDA_VISIBLE_DEVICES="$GPU_INDEX" CUDA_MPS_PIPE_DIRECTORY="$work/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$work/mps/log" "$@"
}

check_mps() {
	section "7. MPS (client limits ${MPS_MIB} MiB, ${MPS_PERCENT} % of the SMs)"
	if ! command -v nvidia-cuda-mps-control >/dev/null; then
		echo "skipped: nvidia-cuda-mps-control not installed"
		return
	fi
	local daemon out i envs base got
	mkdir -p "$work/mps/pipe" "$work/mps/log"
	mps nvidia-cuda-mps-control -f >"$work/mps/log/daemon.out" 2>&1 &
	daemon=$!
	for i in $(seq 50); do
		mps nvidia-cuda-mps-control <<<"get_default_active_thread_percentage" >/dev/null 2>&1 && break
		sleep 0.2
	done
	# The agent's commands (mpsShape.commands): device 0 is the daemon's only GPU.
	out=$(printf '%s\n' "set_default_active_thread_percentage ${MPS_PERCENT}" \
		"set_default_device_pinned_mem_limit 0 ${MPS_MIB}M" \
		"get_default_active_thread_percentage" "get_default_device_pinned_mem_limit 0" |
		mps nvidia-cuda-mps-control)
	echo "daemon ${daemon} defaults:" $out
	local over=$(((MPS_MIB + 1024) * 1024 * 1024)) under=$((MPS_MIB / 2 * 1024 * 1024))
	local wide="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=$((MPS_MIB * 16))M"
	for envs in "" "$wide"; do
		# shellcheck disable=SC2086 # envs is a list of NAME=value words
		out=$(mps env $envs "$work/cudaprog" alloc linear "$under" , free , alloc linear "$over" , meminfo 2>&1)
		echo "client${envs:+ with $envs}:" $out
		[ "$(echo "$out" | reply alloc)" = 0 ] || fail "an MPS client could not allocate ${under} bytes under its ${MPS_MIB} MiB limit"
		[ "$(echo "$out" | awk '$1 == "alloc" { n++; if (n == 2) print $2 }')" != 0 ] ||
			fail "an MPS client${envs:+ with $envs} allocated ${over} bytes past its ${MPS_MIB} MiB limit"
	done
	base=$(native "$work/gpu_check" spin "$SECONDS_PER_RUN" "$BLOCK_US" | kernels_per_s)
	for envs in "" "$wide"; do
		# shellcheck disable=SC2086
		got=$(mps env $envs "$work/gpu_check" spin "$SECONDS_PER_RUN" "$BLOCK_US" | kernels_per_s)
		awk -v g="$got" -v b="$base" -v e="${envs:+ with $envs}" -v p="$MPS_PERCENT" \
			'BEGIN { printf "MPS client%s: %s kernels/s = %.1f %% of native (active threads %d %%)\n", e, g, 100 * g / b, p }'
	done
	echo quit | mps nvidia-cuda-mps-control || fail "the MPS daemon did not take quit"
	for i in $(seq 50); do
		kill -0 "$daemon" 2>/dev/null || break
		sleep 0.2
	done
	if kill -0 "$daemon" 2>/dev/null; then
		fail "the MPS daemon ${daemon} still runs after quit"
		kill "$daemon"
	fi
}

main() {
	require nvidia-smi nvcc make gcc awk ldconfig
	GPU_UUID=$(nvidia-smi -i "$GPU_INDEX" --query-gpu=uuid --format=csv,noheader)
	build
	check_memory
	check_torch
	check_share
	check_launch
	check_tenant
	check_mig
	check_mps
	section "result"
	if [ "$failed" -ne 0 ]; then
		echo "FAILED"
		exit 1
	fi
	echo "all checks passed"
}

main "$@"
