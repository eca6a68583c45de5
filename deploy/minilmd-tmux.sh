#!/usr/bin/env bash
# minilmd-tmux.sh - run `minilmd run CONFIG` in a named tmux session that outlives the SSH connection.
#
# Usage: minilmd-tmux.sh [--no-attach] CONFIG [SESSION]
#   window "run"  (0): minilmd run CONFIG         the supervisor, restarted as the systemd unit restarts it (below)
#   window "logs" (1): minilmd logs -f CONFIG     minilmd resolves CONFIG's run.dir as `minilmd run` does (relative to
#                                                 the config's directory) and waits for the run to appear there
# SESSION defaults to minilmd-<run.name>, or minilmd-<config file stem> when the config has no run.name.
# A session started for another config (two run names that differ only in '.', ':' or '_') is refused, exit 2.
#
# Before the supervisor is started (or started again), `minilmd run CONFIG --check` must accept CONFIG: otherwise
# its message is printed and the launcher exits with its status (2 for a bad config), starting nothing.
# Window "run" keeps the supervisor alive with deploy/minilmd@.service's policy, so that a run under tmux finishes
# unattended as one under systemd does (no tmux session survives a reboot: deploy/README.md names what does): when
# `minilmd run` ends with a status that is not final (a supervisor SIGKILLed, a crash: anything but 0, the final
# statuses of minilmd/protocol.py FINAL_EXIT_STATUSES, the unit's RestartPreventExitStatus, and a death by SIGHUP,
# SIGINT, SIGTERM or SIGPIPE, which systemd counts as clean) it is started again after MINILMD_TMUX_RESTART_SEC
# (RestartSec, 30 s), at most START_LIMIT_BURST starts in START_LIMIT_INTERVAL seconds (StartLimitBurst in
# StartLimitIntervalSec: 5 in 1 h). On 0 (done, or stopped on request), on a final status and at the start limit the
# window ends, saying why on its last line, with the supervisor's status as its own. Its restarts (not its first start)
# carry MINILMD_AUTO_RESTART=tmux: a `minilmd stop` made while the window waited left a stop request in the run
# directory, which such a start honours (it exits 0, starting no trainer: the window ends); the launcher run by hand
# starts the run again (that start clears it).
# A run whose supervisor already runs is refused (exit 2), saying so and how to have the launcher run it (stop it,
# wait, launch again); but when that supervisor is this user's and nothing is left to start it again (its tmux
# session was closed: `tmux kill-session` ends window run's loop, not the supervisor; `minilmd status` says
# "unguarded"), the session gets window logs alone, following it, and the launcher says it does not guard it.
# Idempotent: when the session exists nothing is started twice. A window whose command has ended keeps its last
# output on screen (remain-on-exit) and is started again by the next call; a window closed by hand is recreated.
# Then it attaches (or switches client inside tmux), unless --no-attach is given or this is not a terminal.
#
# Environment:
#   MINILMD              the minilmd executable (default: `minilmd` from PATH); resolved to an absolute path,
#                        because a tmux server started earlier has its own, possibly older, PATH
#   MINILMD_TMUX_SOCKET  use a private tmux server (`tmux -L NAME`) instead of the default one
#   MINILMD_PYTHON       the python that reads CONFIG (default: the python beside minilmd, else python3)
#   MINILMD_TMUX_RESTART_SEC  seconds before window "run" starts a failed supervisor again (default 30)
#   MINILMD_*            but MINILMD_TMUX_*, passed on to both windows (e.g. MINILMD_FAULT for a demo); those of
#                        an earlier launch on the same tmux server are not
#   TMUX_TMPDIR          where tmux keeps its sockets (default /tmp); a socket directory there that is not yours
#                        alone (another user made tmux-UID first) is refused, exit 2, naming TMUX_TMPDIR
set -euo pipefail

usage() { echo "usage: $(basename "$0") [--no-attach] CONFIG [SESSION]" >&2; exit 2; }
# -h/--help: the comment above, without its `# `, on stdout (what the script does, its environment), exit 0
show_help() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
die() { echo "minilmd-tmux: $1" >&2; exit "${2:-1}"; }

tm() {
    if [[ -n "${MINILMD_TMUX_SOCKET:-}" ]]; then tmux -L "$MINILMD_TMUX_SOCKET" "$@"; else tmux "$@"; fi
}

attach=1
args=()
for arg in "$@"; do
    case "$arg" in
        --no-attach) attach=0 ;;
        -h|--help) show_help ;;
        -*) echo "minilmd-tmux: unknown option $arg" >&2; usage ;;
        *) args+=("$arg") ;;
    esac
done
(( ${#args[@]} >= 1 && ${#args[@]} <= 2 )) || usage

command -v tmux >/dev/null || die "tmux is not installed"

# The systemd unit's restart policy (deploy/minilmd@.service), for window "run"; tests/test_deploy_restart.py checks
# these against minilmd/protocol.py FINAL_EXIT_STATUSES and the unit.
FINAL_EXIT_STATUSES=(2 65 73 79)
START_LIMIT_BURST=5
START_LIMIT_INTERVAL=3600
restart_sec=${MINILMD_TMUX_RESTART_SEC:-30}
[[ "$restart_sec" =~ ^[0-9]+(\.[0-9]+)?$ ]] \
    || die "MINILMD_TMUX_RESTART_SEC=$restart_sec is not a number of seconds; nothing was started" 2

# tmux keeps its sockets in ${TMUX_TMPDIR:-/tmp}/tmux-UID and refuses that directory with a bare "unsafe
# permissions" when it is not its user's alone: in /tmp, everyone's, another user can make it first. Say so, and
# the way round it, before anything is started.
socket_dir="${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)"
if [[ -e "$socket_dir" || -L "$socket_dir" ]]; then
    read -r dir_uid dir_user dir_mode < <(stat -c '%u %U %a' -- "$socket_dir")
    if [[ -L "$socket_dir" || ! -d "$socket_dir" || "$dir_uid" != "$(id -u)" ]] || (( 8#$dir_mode & 8#007 )); then
        # $XDG_RUNTIME_DIR only where it is set and yours: under su, sudo, cron or an SSH login without
        # pam_systemd it is unset, and TMUX_TMPDIR= (empty) is /tmp again, the same refusal
        if [[ -n "${XDG_RUNTIME_DIR:-}" && -d "$XDG_RUNTIME_DIR" && ! -L "$XDG_RUNTIME_DIR" && -O "$XDG_RUNTIME_DIR" ]]
        then
            way="\`TMUX_TMPDIR=\$XDG_RUNTIME_DIR $0 ...\` (here $XDG_RUNTIME_DIR)"
        else
            way="\`mkdir -p -m 700 ~/.tmux-sockets && TMUX_TMPDIR=~/.tmux-sockets $0 ...\` (XDG_RUNTIME_DIR is no directory of yours here: unset under su, sudo or cron)"
        fi
        die "tmux's socket directory $socket_dir is not yours alone (owner $dir_user, mode $dir_mode; another user may have made it first), so tmux refuses it (\"unsafe permissions\"). Set TMUX_TMPDIR to a directory of your own, e.g. $way, and attach with the same TMUX_TMPDIR; nothing was started" 2
    fi
fi
[[ -f "${args[0]}" ]] || die "no such config file: ${args[0]}" 2
config=$(realpath -- "${args[0]}")

exe=$(command -v -- "${MINILMD:-minilmd}") \
    || die "minilmd not found: put it on PATH or set MINILMD=/path/to/venv/bin/minilmd"
exe=$(realpath -s -- "$exe")

python=${MINILMD_PYTHON:-}
if [[ -z "$python" ]]; then
    # The venv that holds minilmd has a python that can read TOML (tomllib, or tomli on 3.10).
    python="$(dirname -- "$(readlink -f -- "$exe")")/python"
    [[ -x "$python" ]] || python=python3
fi

# run.name and run.dir, one per line. Only these two: `minilmd run` itself validates the whole config. run.dir is
# only checked to be set here: where it is, a relative one included, is minilmd's to say (window "logs" is given CONFIG).
read_run_section='
import sys
try:
    import tomllib
except ImportError:
    import tomli as tomllib
try:
    with open(sys.argv[1], "rb") as f:
        run = tomllib.load(f).get("run", {})
except (OSError, ValueError) as e:
    sys.exit(f"minilmd-tmux: cannot read {sys.argv[1]}: {e}")
if not isinstance(run, dict):
    sys.exit(f"minilmd-tmux: {sys.argv[1]}: [run] must be a table")
print(run.get("name", ""))
print(run.get("dir", ""))
'
# From "/": `python -c` puts its working directory first on sys.path, and a `tomllib.py` another user left in a
# shared directory the launcher is started from would run as us (minilmd/pychild.py). CONFIG is absolute (realpath).
run_section=$(cd / && "$python" -c "$read_run_section" "$config") || exit 2
{ read -r run_name || true; read -r run_dir || true; } <<<"$run_section"
[[ -n "$run_dir" ]] || die "$config: run.dir is not set (the local run directory); check it with: minilmd run --check $config" 2

session=${args[1]:-minilmd-${run_name:-$(basename -- "$config" .toml)}}
session=${session//[.:]/_}  # tmux does not allow '.' or ':' in session names

passenv=()
for name in $(compgen -e); do
    [[ "$name" == MINILMD_* && "$name" != MINILMD_TMUX_* && "$name" != MINILMD_AUTO_RESTART ]] \
        && passenv+=("$name=${!name}")
done
# A window gets the tmux server's environment, which is that of the launch that started the server: a MINILMD_*
# of an earlier launch (a demo's MINILMD_FAULT) would reach this run's supervisor. Each one this call does not set
# is unset for its windows, and MINILMD_TMUX_* (the launcher's own) always: those of the server, and this call's,
# which a server this call starts (the first session) takes as its environment. So every window's command is the
# same whether its server was running or not. MINILMD_AUTO_RESTART is the window loop's alone (supervise, below):
# neither passed on nor unset here, where it would undo the loop's.
unset_env=()
declare -A unsetting=()
while IFS='=' read -r name _; do
    [[ "$name" == MINILMD_* && "$name" != MINILMD_AUTO_RESTART && -z "${unsetting[$name]:-}" ]] \
        && { [[ "$name" == MINILMD_TMUX_* || -z "${!name+x}" ]]; } && unset_env+=(-u "$name") && unsetting[$name]=1
done < <(tm show-environment -g 2>/dev/null || true; compgen -e | sed 's/$/=/')
prefix=()
(( ${#passenv[@]} + ${#unset_env[@]} )) && prefix=(env "${unset_env[@]}" "${passenv[@]}")
run_cmd=("${prefix[@]}" "$exe" run "$config")
logs_cmd=("${prefix[@]}" "$exe" logs -f "$config")  # run.dir as the supervisor resolves it (daemon/views/runarg.py)

# Window "run"'s command: run_cmd, started again while it fails as the unit would start it again (the header). It
# runs inside the tmux server, so it is self-contained: this function's text, its settings as arguments. Its restarts
# run with MINILMD_AUTO_RESTART=tmux (daemon/base/stoprequest.py): they honour a stop request; its first start, the
# person's, never has it (not even from the tmux server's environment).
supervise() {
    local delay=$1 final=" $2 " burst=$3 interval=$4; shift 4
    local starts=() kept status=0 now t why restart=()
    unset MINILMD_AUTO_RESTART
    while true; do
        printf -v now '%(%s)T' -1
        kept=()
        for t in "${starts[@]}"; do (( now - t < interval )) && kept+=("$t"); done
        starts=("${kept[@]}")
        if (( ${#starts[@]} >= burst )); then
            echo "minilmd-tmux: $burst starts within ${interval}s, the last exit status $status: not started again (the systemd unit's start limit); read supervisor.log, then run the launcher again"
            return "$status"
        fi
        starts+=("$now")
        status=0
        "${restart[@]}" "$@" || status=$?
        why="exit status $status"
        (( status > 128 )) && why="killed by SIG$(kill -l $((status - 128)) 2>/dev/null || echo $((status - 128))) (exit status $status)"
        if (( status == 0 )); then
            echo "minilmd-tmux: minilmd run ended with exit status 0 (the run is done, or stopped on request): not restarted"
            return 0
        elif [[ "$final" == *" $status "* ]]; then
            echo "minilmd-tmux: minilmd run ended with exit status $status, a final one (2 bad config or run owned by another supervisor, 65 bad data, 73 run.dir full, 79 gave up): not restarted; fix the cause, then run the launcher again"
            return "$status"
        elif (( status == 129 || status == 130 || status == 141 || status == 143 )); then
            echo "minilmd-tmux: minilmd run was $why, a clean end for systemd: not restarted"
            return "$status"
        fi
        echo "minilmd-tmux: minilmd run was $why at $(date '+%F %T'): starting it again in ${delay}s (Ctrl-C, or minilmd stop RUN_DIR, stops this)"
        sleep "$delay"
        restart=(env MINILMD_AUTO_RESTART=tmux)
    done
}
run_window_cmd=("$BASH" -c "$(declare -f supervise); supervise \"\$@\"" minilmd-run
                "$restart_sec" "${FINAL_EXIT_STATUSES[*]}" "$START_LIMIT_BURST" "$START_LIMIT_INTERVAL" "${run_cmd[@]}")

# The run's supervisor as `minilmd status --json CONFIG` sees it: "unguarded PID" when it runs and nothing is left
# to start it again if it dies (the tmux session it ran in was closed under it: daemon/base/keeper.py), "running PID"
# when it runs otherwise, nothing when it does not run (or status cannot tell).
supervisor_now() {
    local json
    json=$(cd / && "${prefix[@]}" "$exe" status --json "$config" 2>/dev/null) || return 0
    (cd / && "$python" -c '
import json, sys
try:
    d = json.loads(sys.stdin.read())
    pid = d["state"]["supervisor"]["pid"]
except (ValueError, KeyError, TypeError):
    sys.exit(0)
if d.get("running") and isinstance(pid, int):
    print("unguarded" if d.get("unguarded") else "running", pid)
' <<<"$json") || true
}

# `minilmd run CONFIG --check` before the supervisor is started: a config it would refuse is reported here, with
# --check's message and exit status, instead of in a dead pane of a session that was started for nothing. One
# refusal is no error: the run's own supervisor, a process of this user's, still runs with nothing left to start it
# again (its tmux session was closed, user3 F2): status 1, its pid in $alone_pid, and the caller opens window logs
# on it instead of a second supervisor. A run whose supervisor runs under something else is refused, saying so.
alone_pid=""
check_config() {
    local out status=0 how pid
    out=$("${prefix[@]}" "$exe" run "$config" --check 2>&1) || status=$?
    (( status == 0 )) && return 0
    if (( status == 2 )) && read -r how pid < <(supervisor_now); then
        if [[ "$how" == unguarded && -O "/proc/$pid" ]]; then
            alone_pid=$pid
            return 1
        fi
        printf '%s\n' "$out" >&2
        die "$config: its run already runs (supervisor pid $pid, started by another session, launcher, systemd or by hand), and goes on; nothing was started. Follow it with \`minilmd status $config\` or \`minilmd logs -f $config\`; to have this launcher run it: \`minilmd stop $config\`, wait for the stop, then launch again" 2
    fi
    printf '%s\n' "$out" >&2
    die "$config: \`minilmd run --check\` refused it (exit $status); nothing was started" "$status"
}

# Said when check_config found the run's own supervisor running with nothing to start it again: no window run.
say_alone() {
    echo "minilmd-tmux: $session: the run's supervisor pid $alone_pid already runs, unguarded: the tmux session that started it was closed, so nothing starts it again if it dies. It goes on; window logs follows it, and this session does not guard it (no window run). To have the launcher guard it: \`minilmd stop $config\`, wait for the stop (\`minilmd status $config\`), then run the launcher again"
}

# Whether window $1 of the session is missing or its command has ended: it is about to be (re)started.
window_down() {
    local dead
    dead=$(tm list-panes -t "=$session:$1" -F '#{pane_dead}' 2>/dev/null | head -n 1) || dead=""
    [[ "$dead" != 0 ]]
}

# Make sure window $1 exists and its command is alive; $2 is that command in words, the rest of the arguments it.
ensure_window() {
    local name=$1 shown=$2; shift 2
    local dead
    dead=$(tm list-panes -t "=$session:$name" -F '#{pane_dead}' 2>/dev/null | head -n 1) || dead=""
    if [[ -z "$dead" ]]; then
        tm new-window -d -t "=$session:" -n "$name" -c "$PWD" -- "$@" \; \
            set-option -w -t "=$session:$name" remain-on-exit on
        echo "minilmd-tmux: $session: started window $name: $shown"
    elif [[ "$dead" == 1 ]]; then
        tm respawn-pane -t "=$session:$name" -c "$PWD" -- "$@"
        echo "minilmd-tmux: $session: window $name had ended, started it again"
    else
        echo "minilmd-tmux: $session: window $name is running"
    fi
}

if ! tm has-session -t "=$session" 2>/dev/null; then
    if check_config; then
        # One tmux command queue: remain-on-exit is set before the supervisor can exit, so an early error (a bad
        # config) stays on screen instead of closing the session. The session keeps the config it runs
        # (@minilmd_config).
        tm new-session -d -s "$session" -n run -c "$PWD" -- "${run_window_cmd[@]}" \; \
            set-option -w -t "=$session:run" remain-on-exit on \; \
            set-option -t "=$session:" @minilmd_config "$config"
        echo "minilmd-tmux: $session: started window run: ${run_cmd[*]} (restarted while it fails)"
    else
        tm new-session -d -s "$session" -n logs -c "$PWD" -- "${logs_cmd[@]}" \; \
            set-option -w -t "=$session:logs" remain-on-exit on \; \
            set-option -t "=$session:" @minilmd_config "$config"
        say_alone
    fi
else
    # Runs whose names differ only in '.', ':' and '_' share one session name: never take another config's
    # supervisor for this one's (a session from an older launcher says nothing: it is taken as this config's).
    owner=$(tm show-options -qv -t "=$session:" @minilmd_config 2>/dev/null) || owner=""
    if [[ -n "$owner" && "$owner" != "$config" ]]; then
        die "session $session runs $owner, not $config: nothing was started; give this run a session name of its own as the second argument" 2
    fi
    if ! window_down run || check_config; then
        ensure_window run "${run_cmd[*]} (restarted while it fails)" "${run_window_cmd[@]}"
    else
        say_alone
    fi
fi
ensure_window logs "${logs_cmd[*]}" "${logs_cmd[@]}"

attach_cmd="tmux${MINILMD_TMUX_SOCKET:+ -L $MINILMD_TMUX_SOCKET} attach -t $session"
if (( attach )) && [[ -t 0 && -t 1 ]]; then
    if [[ -n "${TMUX:-}" ]]; then
        tm switch-client -t "=$session" 2>/dev/null || echo "minilmd-tmux: inside another tmux server; run: $attach_cmd"
    else
        exec tmux ${MINILMD_TMUX_SOCKET:+-L "$MINILMD_TMUX_SOCKET"} attach-session -t "=$session"
    fi
else
    echo "minilmd-tmux: attach with: $attach_cmd"
fi
