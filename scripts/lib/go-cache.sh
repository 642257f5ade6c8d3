# Sourced by the build scripts (build-k8s.sh, build-kueue.sh, build-karpenter.sh): their shared steps.
#
# Every binary the e2e tier runs is built from the Go module proxy into a cache OUTSIDE the clone
# (TF_K8S_CACHE, default ~/.cache/tensor-fusion-k8s), so a second run costs seconds. The caller sets TAG
# (the log prefix) before sourcing; `go_tool_main` is the whole of a script that builds one tool with
# `go install module@version` (a module without replace directives builds with exactly its own go.mod).

CACHE_ROOT="${TF_K8S_CACHE:-$HOME/.cache/tensor-fusion-k8s}"
START=$(date +%s)
log() { printf '[%s %3ds] %s\n' "$TAG" "$(($(date +%s) - START))" "$*" >&2; }

# `go build` prints nothing until it is done, minutes on a cold build: run "$@" in the background and
# log every TICK_S seconds meanwhile, so CI logs show the build is alive. The exit status is the
# command's; the command is killed if the script exits first.
TICK_S=30
with_ticker() {
  "$@" &
  local pid=$! waited=0
  trap "kill $pid 2>/dev/null" EXIT
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if ((waited % TICK_S == 0)); then log "go build still running (${waited}s)"; fi
  done
  trap - EXIT
  wait "$pid"
}

# The module's source directory in Go's module cache (downloaded if need be).
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# go_tool_main [--check]: the whole of a script building one tool, from the caller's variables:
#   TOOL, TOOL_VERSION   the cache directory is $CACHE_ROOT/TOOL-TOOL_VERSION
#   MODULE, PACKAGE      `go install PACKAGE@TOOL_VERSION`, a main package of MODULE
#   BINARY               its name in the directory's bin/ (go install names it after PACKAGE's last element)
#   LDFLAGS, COLD_MINUTES the link flags, and the cold build's time for the log
# and its function `copy_config SRC CONFIG`, which fills CONFIG (config/crd/ made) from the module's source
# SRC. Unless cached, builds and copies, then marks the directory ready. Prints the directory last on stdout.
# --check: print it, and exit 1 if anything is missing, building nothing.
go_tool_main() {
  local dir="$CACHE_ROOT/$TOOL-$TOOL_VERSION"
  local ready=0
  [[ -x "$dir/bin/$BINARY" && -f "$dir/config/.ready" ]] && ready=1
  if [[ "${1:-}" == "--check" ]]; then
    echo "$dir"
    ((ready)) || { log "missing: $dir/bin/$BINARY or $dir/config"; exit 1; }
    exit 0
  fi
  if ((ready)); then log "$TOOL $TOOL_VERSION: cached"; echo "$dir"; exit 0; fi
  command -v go >/dev/null || { log "go is not installed (needed to build $TOOL $TOOL_VERSION)"; exit 1; }
  export CGO_ENABLED=0
  mkdir -p "$dir/bin"
  if [[ ! -x "$dir/bin/$BINARY" ]]; then
    log "$TOOL $TOOL_VERSION: building $PACKAGE (cold: about $COLD_MINUTES minutes on 2 cores)"
    rm -rf "$dir/.partial" && mkdir -p "$dir/.partial"
    GOBIN="$dir/.partial" with_ticker go install -trimpath -ldflags "$LDFLAGS" "$PACKAGE@$TOOL_VERSION"
    mv "$dir/.partial/${PACKAGE##*/}" "$dir/bin/$BINARY"
    rmdir "$dir/.partial"
    log "$TOOL: built"
  fi
  rm -rf "$dir/config" && mkdir -p "$dir/config/crd"
  copy_config "$(module_dir "$MODULE@$TOOL_VERSION")" "$dir/config"
  chmod -R u+w "$dir/config"
  touch "$dir/config/.ready"
  log "done in $(($(date +%s) - START))s: $dir"
  echo "$dir"
}
