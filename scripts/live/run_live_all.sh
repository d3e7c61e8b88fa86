#!/usr/bin/env bash
# The live proof: SPECTRACE=1 on real SGLang 0.5.17 EAGLE-3 servers on the H200.
# Run it ON the GPU machine, from the repository root (docs/sglang.md, "The live kit").
# Usage: bash scripts/live/run_live_all.sh [all|variants|overhead|trained|tensors|cost|realworld|metrics|probe]
#   variants  four servers at once (healthy, --speculative-algorithm EAGLE, no lm_head, layers.0 keys),
#             each with SPECTRACE=1 and its own SPECTRACE_DIR; requests; SIGTERM; spectrace view
#   overhead  one healthy server at a time, SPECTRACE off, on, on, off (ABBA), decode throughput of each
#   all       both (overhead is skipped, and says so, when less than OVERHEAD_MIN_S is left)
#   trained   the trained tiny pair (spectrace/eagle3/data), four servers at once: as shipped (ids
#             [-1,1,3], the embedding), ids [0,1,3], and that without lm_head / without d2t; the
#             pair's own prompts, so SGLang's accept length means something
#   realworld field bugs on the trained pair (ids [0,1,3]), five servers at once: healthy with greedy
#             requests, healthy with temperature 1.0 requests (own server, own trace), d2t = arange
#             (absolute ids where offsets belong), draft rope_theta 500000 (trained at 10000), and
#             config "draft_vocab_size": null (0.5.17 then sizes lm_head to the target vocabulary);
#             REALWORLD_ONLY="trained trained-rope" runs only the servers named
#   metrics   --enable-metrics on the trained pair (ids [0,1,3]), three servers at once: "metrics"
#             (SPECTRACE_REPLAY=1), "norep" (replay off) and "rope-replay" (draft rope_theta 500000,
#             SPECTRACE_REPLAY=1); SGLang's own /metrics scraped before and after the pair's prompts
#             (spectrace's series, its accept length against sglang:spec_accept_length); the metrics'
#             cost inside one server (steady load, windows on / metrics-off through SPECTRACE_CONTROL)
#             on metrics and norep in turns A B B A (METRICS_WINDOWS each), which also compares replay
#             on and off between the two servers; logs/metrics-report.json, also in $OUT.
#             METRICS_TURNS (default "metrics norep norep metrics"; "none": no cost turns),
#             METRICS_WINDOWS (8), COST_WINDOW_S (3), METRICS_CLIENTS (32). SGLang 0.5.17's prefill
#             CUDA graph (backend "breakable", on by default) hides the draft's fc / layer / norm from
#             the replay hooks: for a replay file with module outputs, add --disable-prefill-cuda-graph
#             to SGL_EXTRA (decode graphs stay on). On a tree others edit, run a committed snapshot:
#             git archive HEAD | tar -x -C .carry/tree, carry it, run .carry/tree/scripts/live/...
#   probe     spectrace probe live (docs/probe.md): the trained pair, five servers at once, each with
#             SPECTRACE=1 SPECTRACE_REPLAY=1 SPECTRACE_REPLAY_ROWS=PROBE_ROWS (192) and
#             --disable-prefill-cuda-graph --disable-radix-cache --skip-server-warmup (decode graphs on):
#             probe-healthy, probe-rope (draft rope_theta 100), probe-gptj (rope_is_neox_style false),
#             probe-d2t (d2t = arange); these four serve the target with a no-op block in front
#             (make_trained_models.py --pad-block: 0.5.17 cannot capture the embedding, the padded
#             target's boundary 1 is it), ids [0, 2, 4] capturing exactly the trained inputs; and
#             probe-shift, the shipped target with ids [0, 2, 4] written as boundary k (0.5.17 captures
#             [1, 3, 5] for a draft trained on [0, 2, 4]). Four sequences of the pair's language sent
#             one at a time (the kept forwards), then a batch, greedy (probe_prompts.py); after the
#             stop, `spectrace probe TRACE --draft --target` on the CPU there, then spectrace view;
#             logs/probe-report.json, also in $OUT. PROBE_ONLY="probe-healthy probe-rope" runs fewer.
#   tensors   per-module records live: the trained pair (ids [0,1,3]) with CUDA graphs (every replay read
#             back), the same with --disable-cuda-graph, and --speculative-algorithm EAGLE (the fc bypass);
#             their per-stage statistics compared; then the cost inside one server (SPECTRACE_CONTROL
#             windows, on off off on ...) on the graph server and on a GPU-bound 3.4B target
#   cost      that cost part alone, under a steady load (SGLang's decode log lines are the measure),
#             with py-spy profiles of the scheduler when py-spy is on the PATH, and the host's own
#             per-hook floor (bench/serving_hooks.py away from any server); COST_SERVERS picks
#             the servers (default "tiny big")
# Environment: OUT (required; what comes back), CARRY_TAR (default .carry/sgl/sglang-0.5.17-site.tar.xz),
#   LIVE_BUDGET_S (default 480: waits, the bench and the overhead phase fit inside it), BENCH_ROUNDS (6),
#   BENCH_BATCH (32), BENCH_MAX_NEW (256), SGL_EXTRA (extra server flags), STAGGER_S (6),
#   MODELS_PYTHON (python3: the interpreter with torch + transformers for make_tiny_models.py),
#   PORT_BASE (30000), SERVER_CPUS and CLIENT_CPUS (taskset lists, or SERVER_CPUS=auto; see below).
# spectrace is not pip-installed there: livekit.py boot writes a sitecustomize that runs the .pth
# bootstrap (site.addsitedir) and a dist-info carrying the sglang.srt.plugins entry point.
set -u
mode=${1:-all}
case $mode in all|variants|overhead|trained|tensors|cost|realworld|metrics|probe) ;; *) echo "usage: $0 [all|variants|overhead|trained|tensors|cost|realworld|metrics|probe]" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${OUT:?set OUT to the folder whose files come back}
carry=${CARRY_TAR:-$repo/.carry/sgl/sglang-0.5.17-site.tar.xz}
budget=${LIVE_BUDGET_S:-480}
overhead_min=${OVERHEAD_MIN_S:-200}
extra=${SGL_EXTRA---cuda-graph-max-bs-decode 32 --max-total-tokens 65536}
port_base=${PORT_BASE:-30000}   # runs on base, +10, +20, +30; the overhead servers on +110 .. +140
stagger=${STAGGER_S:-6}   # seconds between server starts: each sizes its KV pool from the free memory it sees
tmp=$(dirname "$(mktemp -u)")
site=$tmp/sgl-site
stubs=$tmp/sgl-stubs
W=$tmp/spectrace-live
mkdir -p "$out"
exec > >(tee -a "$out/run.log") 2>&1
SECONDS=0
declare -A PID PORT
phases=()
say() { echo "[$(printf '%4d' "$SECONDS")s] $*"; }
mark() { phases+=("\"$1\": $SECONDS"); }
left() { echo $((budget - SECONDS)); }

# ---------------------------------------------------------------------------- setup
# CPU pinning (SERVER_CPUS / CLIENT_CPUS: taskset lists, or SERVER_CPUS=auto). A tiny-model
# server is host-bound; its scheduler sharing a physical core (SMT) with the detokenizer or
# the client halves its speed for stretches, which swamps a 3 % difference. "auto" gives
# the server one logical CPU of each physical core but the last two, the client those two.
server_pin=() client_pin=()
if [ "${SERVER_CPUS:-}" = auto ] && command -v lscpu >/dev/null && command -v taskset >/dev/null; then
  mapfile -t firsts < <(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -k1,1n | awk -F, '!seen[$2]++ {print $1}')
  if [ "${#firsts[@]}" -ge 4 ]; then
    n=${#firsts[@]}
    SERVER_CPUS=$(IFS=,; echo "${firsts[*]:0:$((n - 2))}")
    CLIENT_CPUS=$(IFS=,; echo "${firsts[*]:$((n - 2))}")
  else
    SERVER_CPUS=
  fi
fi
[ "${SERVER_CPUS:-auto}" != auto ] && [ -n "${SERVER_CPUS:-}" ] && server_pin=(taskset -c "$SERVER_CPUS")
[ -n "${CLIENT_CPUS:-}" ] && client_pin=(taskset -c "$CLIENT_CPUS")
say "mode $mode; repo $repo; python $(python3 -c 'import sys; print(sys.version.split()[0])'); server CPUs ${SERVER_CPUS:-any}; client CPUs ${CLIENT_CPUS:-any}"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
if [ ! -f "$site/.ok" ]; then
  [ -f "$carry" ] || { say "no SGLang tarball at $carry (build it with bash scripts/live/build_sglang_carry.sh .carry/sgl)"; exit 1; }
  rm -rf "$site"; mkdir -p "$site"
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$carry" "$site" && touch "$site/.ok"
  say "extracted $(basename "$carry")"
fi
# An unused attention backend imports deep_gemm at module level: an empty stub package satisfies it.
mkdir -p "$stubs/deep_gemm" && : > "$stubs/deep_gemm/__init__.py"
rm -rf "$W/logs" "$W/traces" "$W/views"
mkdir -p "$W/logs" "$W/traces" "$W/views" "$W/models"
python3 "$here/livekit.py" boot "$W" --repo "$repo" >/dev/null || { say "boot folder failed"; exit 1; }

# Tiny random models, made with the image's own transformers (nothing of ours on the path).
make_models() {  # dir flags...
  local dir=$1; shift
  [ -f "$dir/tiny-eagle3/model.safetensors" ] && return 0
  env -u PYTHONPATH "${MODELS_PYTHON:-python3}" "$here/make_tiny_models.py" "$dir" "$@" > "$dir.log" 2>&1
}
make_trained() {  # dir flags...: the trained pair, written from the repository's data
  local dir=$1; shift
  [ -f "$dir/tiny-eagle3/model.safetensors" ] && return 0
  env -u PYTHONPATH "${MODELS_PYTHON:-python3}" "$here/make_trained_models.py" "$dir" "$@" > "$dir.log" 2>&1
}
# mode probe: each server's models (make_trained_models.py flags)
declare -A PROBE_MODELS=([probe-healthy]="--pad-block" [probe-rope]="--pad-block --rope-theta 100"
  [probe-gptj]="--pad-block --rope-style gptj" [probe-d2t]="--pad-block --d2t-arange" [probe-shift]="--ids 0,2,4")
PROBE_ORDER=(probe-healthy probe-rope probe-gptj probe-d2t probe-shift)
# shellcheck disable=SC2206  # PROBE_ONLY is a word list
[ -n "${PROBE_ONLY:-}" ] && PROBE_ORDER=(${PROBE_ONLY})
if [ "$mode" = tensors ] || [ "$mode" = cost ]; then
  make_trained "$W/models/trained" --ids 0,1,3 & m1=$!
  make_models "$W/models/big" --size big & m2=$!
  for m in $m1 $m2; do wait "$m" || { say "making models failed"; cat "$W"/models/*.log; exit 1; }; done
elif [ "$mode" = trained ]; then
  make_trained "$W/models/trained-embed" & m1=$!
  make_trained "$W/models/trained" --ids 0,1,3 & m2=$!
  make_trained "$W/models/trained-nolmhead" --ids 0,1,3 --no-lm-head & m3=$!
  make_trained "$W/models/trained-nod2t" --ids 0,1,3 --no-d2t & m4=$!
  for m in $m1 $m2 $m3 $m4; do wait "$m" || { say "make_trained_models failed"; cat "$W"/models/*.log; exit 1; }; done
elif [ "$mode" = metrics ]; then
  make_trained "$W/models/trained" --ids 0,1,3 & m1=$!
  make_trained "$W/models/trained-rope" --ids 0,1,3 --rope-theta 500000 & m2=$!
  for m in $m1 $m2; do wait "$m" || { say "make_trained_models failed"; cat "$W"/models/*.log; exit 1; }; done
elif [ "$mode" = probe ]; then
  pids=()
  for v in "${PROBE_ORDER[@]}"; do
    # shellcheck disable=SC2086  # the flags are a word list
    make_trained "$W/models/$v" ${PROBE_MODELS[$v]} & pids+=($!)
  done
  for m in "${pids[@]}"; do wait "$m" || { say "make_trained_models failed"; cat "$W"/models/*.log; exit 1; }; done
  PYTHONPATH=$repo "${MODELS_PYTHON:-python3}" "$here/probe_prompts.py" "$W/probe-prompts.json" --length "${PROBE_ROWS:-192}" || { say "probe prompts failed"; exit 1; }
elif [ "$mode" = realworld ]; then
  make_trained "$W/models/trained" --ids 0,1,3 & m1=$!
  make_trained "$W/models/trained-d2tarange" --ids 0,1,3 --d2t-arange & m2=$!
  make_trained "$W/models/trained-rope" --ids 0,1,3 --rope-theta 500000 & m3=$!
  make_trained "$W/models/trained-headnull" --ids 0,1,3 --draft-vocab-null & m4=$!
  for m in $m1 $m2 $m3 $m4; do wait "$m" || { say "make_trained_models failed"; cat "$W"/models/*.log; exit 1; }; done
else
  make_models "$W/models/midlayer" --draft-keys midlayer & m1=$!
  make_models "$W/models/nolmhead" --draft-keys midlayer --no-lm-head & m2=$!
  make_models "$W/models/layers0" --draft-keys layers.0 & m3=$!
  for m in $m1 $m2 $m3; do wait "$m" || { say "make_tiny_models failed"; cat "$W"/models/*.log; exit 1; }; done
fi
mark setup
say "models ready"

export PYTHONPATH=$repo:$site:$stubs:$W/sc
export SGLANG_ENABLE_JIT_DEEPGEMM=false SGLANG_IS_FLASHINFER_AVAILABLE=false HF_HUB_OFFLINE=1
PATH=$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH   # nvcc/ninja for first-use kernels
export PATH COLUMNS=120
unset SPECTRACE SPECTRACE_DIR SPECTRACE_QUIET

# --------------------------------------------------------------------------- servers
start_server() {  # name port algorithm models spectrace(0|1) mem-fraction [extra flags]
  local name=$1 port=$2 algo=$3 models=$4 on=$5 frac=$6 flags=${7-$extra}
  local envs=("SPECTRACE_DIR=$W/traces/$name" "SPECTRACE_CONTROL=$W/control-$name")
  [ "$on" = 1 ] && envs+=("SPECTRACE=1")
  [ -n "${GRAPH_SAMPLE:-}" ] && envs+=("SPECTRACE_GRAPH_SAMPLE=$GRAPH_SAMPLE")
  [ "$on" = 1 ] && [ -n "${SKIP_FEATURES:-}" ] && envs+=("SPECTRACE_SGLANG_SKIP=$SKIP_FEATURES")
  # shellcheck disable=SC2206  # SERVER_ENV is a word list of NAME=VALUE on purpose
  [ -n "${SERVER_ENV:-}" ] && envs+=($SERVER_ENV)
  # shellcheck disable=SC2086  # flags is a word list on purpose
  env -u SPECTRACE "${envs[@]}" ${server_pin[@]+"${server_pin[@]}"} python3 -m sglang.launch_server --model-path "$models/tiny-llama" \
    --speculative-algorithm "$algo" --speculative-draft-model-path "$models/tiny-eagle3" \
    --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \
    --attention-backend triton --sampling-backend pytorch --grammar-backend none --dtype bfloat16 \
    --mem-fraction-static "$frac" $flags --host 127.0.0.1 --port "$port" --skip-tokenizer-init \
    --decode-log-interval 5 --log-level info > "$W/logs/server-$name.log" 2>&1 &
  PID[$name]=$!
  PORT[$name]=$port
  echo "$name port $port algo $algo spectrace $on frac $frac env [${SERVER_ENV:-}] flags [$flags]" > "$W/logs/cmd-$name.txt"
  say "started $name (pid ${PID[$name]}, port $port, SPECTRACE=$on)"
}

wait_server() {  # name; writes logs/status-NAME.txt; returns 0 when up
  local name=$1 t
  t=$(($(left) - 100)); [ "$t" -gt 330 ] && t=330; [ "$t" -lt 30 ] && t=30   # room to stop and report
  if python3 "$here/livekit.py" wait --port "${PORT[$name]}" --pid "${PID[$name]}" --timeout "$t" \
      > "$W/logs/status-$name.txt"; then
    say "$name: $(cat "$W/logs/status-$name.txt")"
    return 0
  fi
  say "$name: $(cat "$W/logs/status-$name.txt")"
  grep -v Capturing "$W/logs/server-$name.log" | tail -25
  return 1
}

alive() {  # pid: running (a zombie our shell has not reaped yet is not)
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ]
}

descendants() {  # pid -> its children, grandchildren, ...
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}

stop_servers() {  # names...: SIGTERM to each server; SGLang stops its scheduler, spectrace flushes at exit
  local name pid n k kids
  declare -A KIDS=()
  for name in "$@"; do
    pid=${PID[$name]-}
    [ -n "$pid" ] || continue
    KIDS[$name]=$(descendants "$pid")
    kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
  done
  # SGLang 0.5.17 asks the scheduler to exit (ShutdownReq) up to 5 s after SIGTERM and SIGKILLs
  # what is left 15 s later; spectrace's records reach the file at exit. A scheduler still up
  # after STOP_NUDGE_S gets its own SIGTERM, so spectrace's handler flushes before the SIGKILL.
  for n in $(seq 1 45); do
    local up=0
    for name in "$@"; do
      pid=${PID[$name]-}
      [ -n "$pid" ] && alive "$pid" && up=1
      if [ -n "$pid" ] && [ "$n" = "${STOP_NUDGE_S:-13}" ]; then
        for k in ${KIDS[$name]-}; do
          if alive "$k"; then
            kill -TERM "$k" 2>/dev/null && echo "nudged child $k with SIGTERM ${n}s after stop" >> "$W/logs/status-$name.txt"
          fi
        done
      fi
    done
    [ $up = 0 ] && break
    sleep 1
  done
  for name in "$@"; do
    pid=${PID[$name]-}
    [ -n "$pid" ] || continue
    kids=${KIDS[$name]-}
    if alive "$pid"; then
      say "$name: still alive after SIGTERM; SIGKILL"
      echo "forced kill after 45s" >> "$W/logs/status-$name.txt"
      # shellcheck disable=SC2086  # kids is a list of pids
      kill -KILL "$pid" $kids 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    for n in $kids; do alive "$n" && kill -KILL "$n" 2>/dev/null; done
    say "$name stopped; trace files: $(find "$W/traces/$name" -name '*.jsonl' 2>/dev/null | wc -l)"
    unset "PID[$name]"
  done
}

retry_without_extra() {  # name port algo models on frac: a flag this SGLang refuses -> once more without extras
  if [ -n "$extra" ] && grep -q "unrecognized arguments\|error: argument" "$W/logs/server-$1.log" 2>/dev/null; then
    say "$1: SGLang refused [$extra]; starting again without it"
    mv "$W/logs/server-$1.log" "$W/logs/server-$1.refused.log"
    start_server "$1" "$2" "$3" "$4" "$5" "$6" ""
    wait_server "$1"
    return $?
  fi
  return 1
}

view() {  # name: plain text and JSON views of its traces
  local name=$1
  env -u SPECTRACE python3 -m spectrace view "$W/traces/$name" --no-pager > "$W/views/$name.txt" 2>&1
  env -u SPECTRACE python3 -m spectrace view "$W/traces/$name" --json > "$W/views/$name.json" 2> "$W/views/$name.json.err"
}

# shellcheck disable=SC2329  # invoked by the EXIT trap
finish() {
  trap - EXIT INT TERM
  stop_servers "${!PID[@]}"
  mark end
  (IFS=,; echo "{${phases[*]}}") > "$W/phases.json"
  python3 "$here/livekit.py" summarize "$W" "$out" || say "summary failed"
  : > "$out/views.txt"
  for f in "$W"/views/*.txt; do
    [ -f "$f" ] || continue
    { echo "===== spectrace view $(basename "$f" .txt) ====="; cat "$f"; echo; } >> "$out/views.txt"
  done
  tar -C "$W" -czf "$out/traces.tar.gz" traces views phases.json 2>/dev/null
  tar -C "$W" -czf "$out/logs.tar.gz" logs 2>/dev/null
  say "done; in \$OUT: $(cd "$out" && echo *)"
  [ -f "$out/summary.md" ] && cat "$out/summary.md"
}
trap finish EXIT
trap 'say "interrupted"; exit 1' INT TERM

report_servers() {  # names...: error blocks each server printed, and SGLang's last accept length
  local v
  for v in "$@"; do
    say "$v: printed $(grep -c '^==== spectrace: ERROR' "$W/logs/server-$v.log") error block(s); $(grep 'accept len' "$W/logs/server-$v.log" | tail -1 | grep -o 'accept len: [0-9.]*')"
  done
}

# -------------------------------------------------------------------- phase: variants
run_variants() {
  local v
  declare -A ALGO=([healthy]=EAGLE3 [eagle]=EAGLE [nolmhead]=EAGLE3 [layers0]=EAGLE3)
  declare -A MODELS=([healthy]=midlayer [eagle]=midlayer [nolmhead]=nolmhead [layers0]=layers0)
  declare -A VPORT=([healthy]=$port_base [eagle]=$((port_base + 10)) [nolmhead]=$((port_base + 20)) [layers0]=$((port_base + 30)))
  local order=(healthy eagle nolmhead layers0)
  # Staggered: each server sizes its KV pool from the free memory it sees at start.
  for v in "${order[@]}"; do
    start_server "$v" "${VPORT[$v]}" "${ALGO[$v]}" "$W/models/${MODELS[$v]}" 1 0.15
    sleep "$stagger"
  done
  for v in "${order[@]}"; do
    wait_server "$v" || retry_without_extra "$v" "${VPORT[$v]}" "${ALGO[$v]}" "$W/models/${MODELS[$v]}" 1 0.15 || true
  done
  mark variants_up
  for v in "${order[@]}"; do
    if grep -q "^port .* up after" "$W/logs/status-$v.txt" 2>/dev/null; then
      python3 "$here/livekit.py" probe --port "${VPORT[$v]}" --out "$W/logs/probe-$v.json" || say "$v: probe failed"
    fi
  done
  sleep "$stagger"   # one more decode-log interval reaches the logs
  mark variants_requests
  stop_servers "${order[@]}"
  for v in "${order[@]}"; do view "$v"; done
  mark variants_done
  report_servers "${order[@]}"
}

# -------------------------------------------------------------------- phase: overhead
snapshot_processes() {  # name: CPU time, threads and GPU contexts of the server's process tree
  # after its bench, so an on/off gap can be placed in a process (scheduler, tokenizer, ...).
  local name=$1 root=${PID[$1]-} f="$W/logs/procs-$1.txt"
  [ -n "$root" ] || return 0
  {
    echo "# ps: pid ppid threads cpu-time rss-kb command (the server's process tree)"
    ps -eo pid=,ppid=,nlwp=,time=,rss=,args= | awk -v root="$root" '
      { pid[NR]=$1; ppid[NR]=$2; line[NR]=$0 } END {
        keep[root]=1
        for (pass = 0; pass < 4; pass++) for (i = 1; i <= NR; i++) if (ppid[i] in keep) keep[pid[i]]=1
        for (i = 1; i <= NR; i++) if (pid[i] in keep) print substr(line[i], 1, 200) }'
    echo "# nvidia-smi compute apps: pid, used memory"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null || true
  } > "$f"
}

run_overhead() {
  # One healthy server at a time, in the order off, on, on, off (ABBA): each measured alone
  # on the GPU from the same fresh start, so neither co-tenancy nor start order favours a
  # side, and a drift over time cancels in the pooled ratio. off-1 vs off-2 is the A/A
  # control: the spread between two identical servers. OVERHEAD_ON_SPECTRACE=0 makes all
  # four "off" (the harness's own bias, pooled).
  # A third label, "skip", is SPECTRACE=1 with the SGLang features in OVERHEAD_SKIP (default:
  # the per-step ones) left unpatched: it splits spectrace's cost into per-step hooks and the rest.
  local on_flag=${OVERHEAD_ON_SPECTRACE:-1} i=0 label name flag files=()
  local -A seen_label=()
  # shellcheck disable=SC2086  # OVERHEAD_ORDER is a word list (a shorter order, e.g. "on", for a quick look)
  for label in ${OVERHEAD_ORDER:-off on on off}; do
    i=$((i + 1))
    seen_label[$label]=$(( ${seen_label[$label]:-0} + 1 ))
    name=overhead-$label-${seen_label[$label]}
    flag=0; SKIP_FEATURES=
    [ "$label" = on ] && flag=$on_flag
    if [ "$label" = skip ]; then
      flag=1
      SKIP_FEATURES=${OVERHEAD_SKIP:-acceptance,graph_replay,draft_graph_replay,draft_extend_graph_replay,draft_extend_stale_input}
    fi
    if [ "$(left)" -lt 75 ]; then
      say "overhead: $(left)s left, $name not run"
      break
    fi
    start_server "$name" "$((port_base + 100 + 10 * i))" EAGLE3 "$W/models/midlayer" "$flag" 0.3
    if wait_server "$name" || retry_without_extra "$name" "$((port_base + 100 + 10 * i))" EAGLE3 "$W/models/midlayer" "$flag" 0.3; then
      ${client_pin[@]+"${client_pin[@]}"} python3 "$here/livekit.py" bench-one --label "$label" --port "$((port_base + 100 + 10 * i))" --rounds "${BENCH_ROUNDS:-6}" \
        --batch "${BENCH_BATCH:-32}" --max-new "${BENCH_MAX_NEW:-256}" --max-s "${BENCH_ONE_S:-40}" --out "$W/logs/bench-$name.json" \
        && files+=("$W/logs/bench-$name.json")
    fi
    snapshot_processes "$name"
    stop_servers "$name"
    mark "$name"
  done
  if [ ${#files[@]} -gt 0 ]; then
    python3 "$here/livekit.py" bench-merge --out "$W/logs/bench.json" "${files[@]}" || echo "bench merge failed" > "$W/logs/status-overhead.txt"
  else
    echo "no overhead server came up" > "$W/logs/status-overhead.txt"
  fi
  for name in overhead-on-1 overhead-on-2 overhead-skip-1 overhead-skip-2; do [ -d "$W/traces/$name" ] && view "$name"; done
  mark overhead_done
}

# ---------------------------------------------------------------------- phase: trained
run_trained() {
  local v order=(trained-embed trained trained-nolmhead trained-nod2t)
  declare -A VPORT=([trained-embed]=$port_base [trained]=$((port_base + 10)) [trained-nolmhead]=$((port_base + 20)) [trained-nod2t]=$((port_base + 30)))
  # fp16 as trained; a draft this small needs no more
  for v in "${order[@]}"; do
    start_server "$v" "${VPORT[$v]}" EAGLE3 "$W/models/$v" 1 0.15 "$extra --dtype float16"
    sleep "$stagger"
  done
  for v in "${order[@]}"; do
    wait_server "$v" || true   # the embedding capture may crash 0.5.17: its trace is the point then
  done
  mark trained_up
  for v in "${order[@]}"; do
    if grep -q "^port .* up after" "$W/logs/status-$v.txt" 2>/dev/null; then
      python3 "$here/livekit.py" probe --port "${VPORT[$v]}" --prompts "$repo/spectrace/eagle3/data/demo.json" \
        --out "$W/logs/probe-$v.json" || say "$v: probe failed"
    fi
  done
  sleep "$stagger"
  mark trained_requests
  stop_servers "${order[@]}"
  for v in "${order[@]}"; do view "$v"; done
  mark trained_done
  report_servers "${order[@]}"
}

# -------------------------------------------------------------------- phase: realworld
run_realworld() {
  local v port order=(trained trained-sampled trained-d2tarange trained-rope trained-headnull)
  declare -A VPORT=([trained]=$port_base [trained-sampled]=$((port_base + 10)) [trained-d2tarange]=$((port_base + 20))
    [trained-rope]=$((port_base + 30)) [trained-headnull]=$((port_base + 40)))
  # trained-sampled serves the healthy pair's own models; its server is its own, so is its trace
  declare -A MODELS=([trained]=trained [trained-sampled]=trained [trained-d2tarange]=trained-d2tarange
    [trained-rope]=trained-rope [trained-headnull]=trained-headnull)
  declare -A TEMP=([trained]=0 [trained-sampled]=1.0 [trained-d2tarange]=0 [trained-rope]=0 [trained-headnull]=0)
  # shellcheck disable=SC2206  # REALWORLD_ONLY is a word list
  [ -n "${REALWORLD_ONLY:-}" ] && order=(${REALWORLD_ONLY})
  for v in "${order[@]}"; do
    start_server "$v" "${VPORT[$v]}" EAGLE3 "$W/models/${MODELS[$v]}" 1 0.12 "$extra --dtype float16"
    sleep "$stagger"
  done
  for v in "${order[@]}"; do
    wait_server "$v" || true   # a variant SGLang refuses at load: its log and trace are the point then
  done
  mark realworld_up
  for v in "${order[@]}"; do
    port=${VPORT[$v]}
    if grep -q "^port .* up after" "$W/logs/status-$v.txt" 2>/dev/null; then
      python3 "$here/livekit.py" probe --port "$port" --prompts "$repo/spectrace/eagle3/data/demo.json" \
        --temperature "${TEMP[$v]}" --out "$W/logs/probe-$v.json" || say "$v: probe failed"
    fi
  done
  sleep "$stagger"
  mark realworld_requests
  stop_servers "${order[@]}"
  for v in "${order[@]}"; do view "$v"; done
  mark realworld_done
  report_servers "${order[@]}"
}

# ------------------------------------------------------------------------ phase: probe
run_probe() {
  local v order=("${PROBE_ORDER[@]}") i=0 rc
  declare -A VPORT=()
  # The prefill runs eagerly (its CUDA graph would hide the target's choices from the capture);
  # no radix cache (a cached prefix starts the extend past position 0); no warm-up request (it
  # would take one of the 4 kept forwards; so would /health's one-token generation, which
  # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false turns off). Decode CUDA graphs stay on.
  local flags="$extra --dtype float16 --disable-prefill-cuda-graph --disable-radix-cache --skip-server-warmup"
  for v in "${order[@]}"; do
    VPORT[$v]=$((port_base + 10 * i)); i=$((i + 1))
    SERVER_ENV="SPECTRACE_REPLAY=1 SPECTRACE_REPLAY_ROWS=${PROBE_ROWS:-192} SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false" start_server "$v" "${VPORT[$v]}" EAGLE3 "$W/models/$v" 1 0.12 "$flags"
    sleep "$stagger"
  done
  for v in "${order[@]}"; do wait_server "$v" || true; done
  mark probe_up
  for v in "${order[@]}"; do
    if grep -q "^port .* up after" "$W/logs/status-$v.txt" 2>/dev/null; then
      python3 "$here/livekit.py" probe --port "${VPORT[$v]}" --prompts "$W/probe-prompts.json" \
        --out "$W/logs/probe-$v.json" || say "$v: requests failed"
    fi
  done
  sleep "$stagger"   # one more decode-log interval reaches the logs
  mark probe_requests
  stop_servers "${order[@]}"
  mark probe_stopped
  # The probe on the CPU of this machine, after the servers stopped: one process per trace.
  # Waited for by pid: a bare `wait` would also wait for the tee behind the log (bash 5.1+).
  local probes=()
  for v in "${order[@]}"; do
    (
      CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 env -u SPECTRACE python3 -m spectrace probe "$W/traces/$v" \
        --draft "$W/models/$v/tiny-eagle3" --target "$W/models/$v/tiny-llama" > "$W/views/spectrace-probe-$v.txt" 2>&1
      echo "exit $?" >> "$W/views/spectrace-probe-$v.txt"
    ) &
    probes+=($!)
  done
  wait "${probes[@]}"
  for v in "${order[@]}"; do
    rc=$(tail -1 "$W/views/spectrace-probe-$v.txt")
    say "$v: spectrace probe $rc: $(grep -m1 '^verdict' "$W/views/spectrace-probe-$v.txt")"
  done
  mark probe_probed
  for v in "${order[@]}"; do view "$v"; done
  mark probe_done
  report_servers "${order[@]}"
  python3 "$here/livekit.py" probe-report "$W" "${order[@]}" --out "$W/logs/probe-report.json" && cp "$W/logs/probe-report.json" "$out/"
  : > "$out/probe.txt"
  for v in "${order[@]}"; do
    { echo "===== spectrace probe $v ====="; cat "$W/views/spectrace-probe-$v.txt"; echo; } >> "$out/probe.txt"
  done
}

# ---------------------------------------------------------------------- phase: metrics
scrape() {  # name when: SGLang's own /metrics of that server, kept as logs/metrics-NAME-WHEN.txt
  grep -q "^port .* up after" "$W/logs/status-$1.txt" 2>/dev/null || return 0
  python3 "$here/livekit.py" scrape --port "${PORT[$1]}" --out "$W/logs/metrics-$1-$2.txt" || say "$1: /metrics not read"
}

run_metrics() {
  local v turn k order=(metrics norep rope-replay)
  declare -A VPORT=([metrics]=$port_base [norep]=$((port_base + 10)) [rope-replay]=$((port_base + 20)))
  declare -A MODELS=([metrics]=trained [norep]=trained [rope-replay]=trained-rope)
  declare -A SENV=([metrics]="SPECTRACE_REPLAY=1" [norep]="" [rope-replay]="SPECTRACE_REPLAY=1")
  declare -A TURNS=()
  for v in "${order[@]}"; do
    SERVER_ENV=${SENV[$v]} start_server "$v" "${VPORT[$v]}" EAGLE3 "$W/models/${MODELS[$v]}" 1 0.12 "$extra --dtype float16 --enable-metrics"
    sleep "$stagger"
  done
  for v in "${order[@]}"; do wait_server "$v" || true; done
  mark metrics_up
  for v in "${order[@]}"; do scrape "$v" before; done
  for v in "${order[@]}"; do
    if grep -q "^port .* up after" "$W/logs/status-$v.txt" 2>/dev/null; then
      python3 "$here/livekit.py" probe --port "${VPORT[$v]}" --prompts "$repo/spectrace/eagle3/data/demo.json" \
        --out "$W/logs/probe-$v.json" || say "$v: probe failed"
    fi
  done
  sleep "$stagger"   # one more decode-log interval: SGLang's gauge and spectrace's flush
  for v in "${order[@]}"; do scrape "$v" after; done
  mark metrics_probed
  # The metrics' cost inside one server (windows on / metrics-off), on both twins in turns
  # A B B A: the same turns compare replay on (metrics) and off (norep) between servers.
  for turn in ${METRICS_TURNS:-metrics norep norep metrics}; do
    grep -q "^port .* up after" "$W/logs/status-$turn.txt" 2>/dev/null || continue
    if [ "$(left)" -lt 90 ]; then say "metrics cost: $(left)s left, turn $turn not run"; break; fi
    TURNS[$turn]=$(( ${TURNS[$turn]:-0} + 1 ))
    k=${TURNS[$turn]}
    ${client_pin[@]+"${client_pin[@]}"} python3 "$here/livekit.py" steady-bench --port "${VPORT[$turn]}" --control "$W/control-$turn" \
      --log "$W/logs/server-$turn.log" --clients "${METRICS_CLIENTS:-32}" --max-new 256 --windows "${METRICS_WINDOWS:-8}" \
      --window-s "${COST_WINDOW_S:-3}" --prompts "$repo/spectrace/eagle3/data/demo.json" --off-word metrics-off \
      --out "$W/logs/steady-$turn-$k.json" || say "steady bench $turn-$k failed"
    mark "metrics_cost_$turn-$k"
  done
  for v in metrics norep; do scrape "$v" end; done
  stop_servers "${order[@]}"
  for v in "${order[@]}"; do view "$v"; done
  mark metrics_done
  report_servers "${order[@]}"
  python3 "$here/livekit.py" metrics-report "$W" --out "$W/logs/metrics-report.json" && cp "$W/logs/metrics-report.json" "$out/"
}

# ------------------------------------------------------------------------ the cost
cost_on() {  # name port clients max-new label: spectrace on/off inside one server, then a profile
  local name=$1 port=$2 clients=$3 max_new=$4 label=$5 prompts=() sched
  grep -q "^port .* up after" "$W/logs/status-$name.txt" 2>/dev/null || return 0
  [ "$label" = tiny ] && prompts=(--prompts "$repo/spectrace/eagle3/data/demo.json")
  ${client_pin[@]+"${client_pin[@]}"} python3 "$here/livekit.py" steady-bench --port "$port" --control "$W/control-$name" \
    --log "$W/logs/server-$name.log" --clients "$clients" --max-new "$max_new" --windows "${COST_WINDOWS:-24}" \
    --window-s "${COST_WINDOW_S:-3}" "${prompts[@]}" --out "$W/logs/steady-$label.json" || say "steady bench failed"
  # Where the scheduler's time goes with spectrace on, thread by thread (py-spy, when carried).
  sched=$(pgrep -f "sglang::scheduler" | head -1)
  if [ -n "$sched" ] && command -v py-spy >/dev/null; then
    ${client_pin[@]+"${client_pin[@]}"} python3 "$here/livekit.py" steady-bench --port "$port" --control "$W/control-$name" \
      --log "$W/logs/server-$name.log" --clients "$clients" --max-new "$max_new" --windows 3 --window-s 4 --pattern on \
      "${prompts[@]}" --out "$W/logs/steady-$label-profile-load.json" > /dev/null 2>&1 &
    local load=$!
    sleep 8
    py-spy record --pid "$sched" --duration 6 --rate 250 --threads --nonblocking --format raw \
      --output "$W/logs/pyspy-$label.txt" > "$W/logs/pyspy-$label.log" 2>&1 || say "py-spy failed"
    wait "$load"
  fi
}

# ---------------------------------------------------------------------- phase: tensors
run_tensors() {
  local v order=(graph eager eagle sampled)
  declare -A VPORT=([graph]=$port_base [eager]=$((port_base + 10)) [eagle]=$((port_base + 20)) [sampled]=$((port_base + 30)))
  declare -A ALG=([graph]=EAGLE3 [eager]=EAGLE3 [eagle]=EAGLE [sampled]=EAGLE3)
  declare -A FLAGS=([graph]="$extra --dtype float16" [eager]="$extra --dtype float16 --disable-cuda-graph" [eagle]="$extra --dtype float16" [sampled]="$extra --dtype float16")
  # graph, eager and eagle read back every replay (the same steps as the eager server);
  # "sampled" is the default (SPECTRACE_GRAPH_SAMPLE unset), for the cost.
  declare -A SAMPLE=([graph]=1 [eager]=1 [eagle]=1 [sampled]=)
  for v in "${order[@]}"; do
    GRAPH_SAMPLE=${SAMPLE[$v]} start_server "$v" "${VPORT[$v]}" "${ALG[$v]}" "$W/models/trained" 1 0.1 "${FLAGS[$v]}"
    sleep "$stagger"
  done
  for v in "${order[@]}"; do wait_server "$v" || true; done
  mark tensors_up
  for v in "${order[@]}"; do
    if grep -q "^port .* up after" "$W/logs/status-$v.txt" 2>/dev/null; then
      python3 "$here/livekit.py" probe --port "${VPORT[$v]}" --prompts "$repo/spectrace/eagle3/data/demo.json" \
        --out "$W/logs/probe-$v.json" || say "$v: probe failed"
    fi
  done
  sleep "$stagger"
  stop_servers eager eagle graph
  mark tensors_requests
  # The graph and eager servers saw the same prompts and nothing else: their statistics compare.
  python3 "$here/livekit.py" compare-stats "$W/traces/graph" "$W/traces/eager" --out "$W/logs/compare-graph-eager.json" || true
  cost_on sampled "${VPORT[sampled]}" 32 256 tiny
  stop_servers sampled
  mark tensors_cost_tiny
  for v in "${order[@]}"; do view "$v"; done
  if [ "$(left)" -ge 200 ]; then
    start_server big "$((port_base + 40))" EAGLE3 "$W/models/big" 1 0.6 "--cuda-graph-max-bs-decode 64"
    wait_server big && cost_on big "$((port_base + 40))" 64 128 big
    stop_servers big
    view big
  else
    say "big target skipped: $(left)s left"
  fi
  mark tensors_done
}

# ------------------------------------------------------------------------ phase: cost
host_facts() {  # what one hook call costs on this host's CPU, away from any server (the live figure's floor)
  {
    echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
    echo "cpu: $(lscpu 2>/dev/null | grep -m1 'Model name' | sed 's/.*: *//')"
    python3 -c "import timeit,time; n=200000; print('perf_counter ns per call:', round(timeit.timeit(time.perf_counter, number=n)/n*1e9, 1))"
    ${server_pin[@]+"${server_pin[@]}"} python3 "$repo/bench/serving_hooks.py" --steps 1000 --rounds 3 2>&1 | tail -4
  } > "$W/logs/host.txt" 2>&1
}

run_cost() {  # the cost part of tensors alone: the trained pair (default sampling), then the 3.4B target
  host_facts
  case " ${COST_SERVERS:-tiny big} " in *" tiny "*)
    GRAPH_SAMPLE= start_server sampled "$port_base" EAGLE3 "$W/models/trained" 1 0.1 "$extra --dtype float16"
    wait_server sampled && cost_on sampled "$port_base" 32 256 tiny
    stop_servers sampled
    view sampled
    mark cost_tiny ;;
  esac
  case " ${COST_SERVERS:-tiny big} " in *" big "*)
    start_server big "$((port_base + 40))" EAGLE3 "$W/models/big" 1 0.6 "--cuda-graph-max-bs-decode 64"
    wait_server big && cost_on big "$((port_base + 40))" 64 128 big
    stop_servers big
    view big
    mark cost_big ;;
  esac
}

if [ "$mode" = tensors ]; then run_tensors; exit 0; fi
if [ "$mode" = cost ]; then run_cost; exit 0; fi
if [ "$mode" = trained ]; then run_trained; exit 0; fi
if [ "$mode" = realworld ]; then run_realworld; exit 0; fi
if [ "$mode" = metrics ]; then run_metrics; exit 0; fi
if [ "$mode" = probe ]; then run_probe; exit 0; fi
if [ "$mode" != overhead ]; then run_variants; fi
if [ "$mode" = overhead ] || { [ "$mode" = all ] && [ "$(left)" -ge "$overhead_min" ]; }; then
  run_overhead
elif [ "$mode" = all ]; then
  say "overhead skipped: $(left)s left of LIVE_BUDGET_S=$budget (needs $overhead_min); run mode 'overhead' as a second call"
  echo "skipped in this call ($SECONDS s used): run 'run_live_all.sh overhead'" > "$W/logs/status-overhead.txt"
fi
exit 0
