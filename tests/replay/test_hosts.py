"""Where the ranks run: --hostfile, --launcher and Slurm allocations (``replay._hosts``).

The command lines are built by a pure function, so Slurm is tested by its environment
variables (there is no Slurm here) and the line the launcher would start."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from replay import _hosts
from replay._errors import UsageError
from tests.conftest import mpiexec, run_cli
from tests.traces import SGDMF_2

WORKER = ["python", "-m", "replay._worker"]
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "node[01-02]"}


def test_no_placement_is_todays_command_line() -> None:
    cmd = _hosts.mpiexec_command("mpiexec", 2, WORKER, _hosts.Placement(), env={})
    assert cmd == ["mpiexec", "-n", "2", *WORKER]


def test_hostfile_and_launcher_go_before_the_ranks() -> None:
    cmd = _hosts.mpiexec_command("mpiexec", 3, WORKER, _hosts.Placement("/h", "ssh"), env={})
    assert cmd == ["mpiexec", "-f", "/h", "-launcher", "ssh", "-n", "3", *WORKER]


def test_a_slurm_allocation_is_recognised() -> None:
    assert _hosts.slurm_tasks(SLURM) == 4 and _hosts.default_ranks(SLURM) == 4
    cmd = _hosts.mpiexec_command("mpiexec", 4, WORKER, _hosts.Placement(), env=SLURM)
    assert cmd == ["mpiexec", "-launcher", "slurm", "-n", "4", *WORKER]
    # the user's launcher wins; a job id alone (a login shell's leftovers) is no allocation
    chosen = _hosts.mpiexec_command("mpiexec", 4, WORKER, _hosts.Placement(None, "ssh"), SLURM)
    assert chosen[1:3] == ["-launcher", "ssh"]
    assert _hosts.default_ranks({"SLURM_JOB_ID": "1"}) == 1
    assert _hosts.mpiexec_command("m", 1, [], _hosts.Placement(), env={"SLURM_JOB_ID": "1"}) == [
        "m",
        "-n",
        "1",
    ]


def test_more_ranks_than_the_allocation_is_one_clear_line() -> None:
    _hosts.check_allocation(4, SLURM)
    _hosts.check_allocation(64, {})  # no allocation: no limit here
    with pytest.raises(UsageError) as err:
        _hosts.check_allocation(8, SLURM)
    assert str(err.value).startswith("--ranks 8 is more than the 4 task(s) of Slurm job 4242")
    assert "\n" not in str(err.value)


def test_a_hostfile_must_be_readable_and_name_a_host(tmp_path: Path) -> None:
    good = tmp_path / "hosts"
    good.write_text("# the cluster\nnode01:2\nnode02:2\n")
    assert _hosts.check_hostfile(str(good)) == str(good)
    (tmp_path / "empty").write_text("# nothing\n\n")
    for path, what in [
        (tmp_path / "missing", "no such file"),
        (tmp_path, "is a directory"),
        (tmp_path / "empty", "names no host"),
    ]:
        with pytest.raises(UsageError, match=what):
            _hosts.check_hostfile(str(path))


good_hosts = st.from_regex(r"[a-z][a-z0-9.-]{0,12}", fullmatch=True)
bad_slots = st.one_of(
    st.sampled_from(["0", "-1", "", "abc", "2.5", "+3", "０", " 2"]),
    st.integers(max_value=0).map(str),
)


@given(
    before=st.lists(st.tuples(good_hosts, st.integers(1, 64)), max_size=3),
    host=good_hosts,
    how=st.sampled_from(["slots", "space", "nohost"]),
    slots=bad_slots,
)
def test_a_host_file_line_mpiexec_cannot_use_is_refused_before_a_start(
    tmp_path_factory: pytest.TempPathFactory,
    before: list[tuple[str, int]],
    host: str,
    how: str,
    slots: str,
) -> None:
    """mpiexec dies on a signal (host:0, host:abc), stops parsing (a space in a host) or
    waits forever (host:-1) on such lines: each is one line naming the file's line."""
    bad = {"slots": f"{host}:{slots}", "space": f"{host} x:2", "nohost": f":{len(host)}"}[how]
    lines = ["# hosts", *(f"{h}:{n}" for h, n in before), bad, "after:1"]
    path = tmp_path_factory.mktemp("hosts") / "hosts"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError) as err:
        _hosts.check_hostfile(str(path))
    assert f"line {len(before) + 2}: " in str(err.value) and "\n" not in str(err.value)
    # the same file without that line is one mpiexec can read; hydra's key=value kept
    lines.remove(bad)
    path.write_text("\n".join([*lines, f"{host}:2 ifhn=eth0"]) + "\n")
    assert _hosts.check_hostfile(str(path)) == str(path)


def test_an_unreachable_host_is_named() -> None:
    lines = [
        "ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known",
        "[mpiexec@vm] ui_cmd_cb (pmiserv_pmci.c:51): Launch proxy failed.",
    ]
    line = _hosts.unreachable_host(lines)
    assert line is not None and line.startswith("mpiexec cannot reach host nosuchhost.invalid")
    assert "Name or service not known" in line
    refused = ["ssh: connect to host node07 port 22: Connection refused"]
    assert "host node07 (Connection refused)" in str(_hosts.unreachable_host(refused))
    assert _hosts.unreachable_host(["iter 1"]) is None


def test_ssh_gets_a_connect_timeout_unless_the_user_set_its_options() -> None:
    """ssh's own default waits minutes (a dropped packet) or for ever (a host that
    accepts and stays silent): with ssh as hydra's launcher mpiexec gets a timeout."""
    want = {"HYDRA_LAUNCHER_EXTRA_ARGS": f"-o ConnectTimeout={_hosts.SSH_CONNECT_TIMEOUT_S}"}
    hosts = _hosts.Placement("hosts", None)
    assert _hosts.launcher_env(hosts, {}) == want
    assert _hosts.launcher_env(_hosts.Placement(None, "ssh"), {}) == want
    assert _hosts.launcher_env(hosts, {"HYDRA_LAUNCHER": "ssh"}) == want
    # not for another launcher (srun would refuse ssh's options), nor over the user's own
    for placement, env in [
        (_hosts.Placement("hosts", "fork"), {}),
        (_hosts.Placement("hosts", "rsh"), {}),
        (hosts, SLURM),
        (hosts, {"HYDRA_LAUNCHER": "fork"}),
        (hosts, {"HYDRA_LAUNCHER_EXTRA_ARGS": "-o ConnectTimeout=300"}),
    ]:
        assert _hosts.launcher_env(placement, env) == {}, (placement, env)


def test_a_host_that_lets_ssh_time_out_is_named() -> None:
    lines = [
        "Connection timed out during banner exchange",
        "Connection to 10.255.255.1 port 22 timed out",
        "[mpiexec@vm] ui_cmd_cb (pmiserv_pmci.c:51): Launch proxy failed.",
    ]
    line = _hosts.unreachable_host(lines)
    assert line == (
        "mpiexec cannot reach host 10.255.255.1 (no answer from its ssh within "
        f"{_hosts.SSH_CONNECT_TIMEOUT_S} s); fix that host in the host file or check it is up "
        "and accepts ssh without a password"
    )


@given(name=st.from_regex(r"[a-z]{2,10}", fullmatch=True))
def test_a_launcher_hydra_lacks_or_cannot_use_is_named_not_a_dead_rank(name: str) -> None:
    """hydra knows only the launchers it was built with (this mpich wheel has no pbs or
    cobalt), and an external launcher fails outside its scheduler's job: neither is a
    rank that died, as the job's message used to say."""
    where = "[mpiexec@vm] HYDT_bsci_init (lib/tools/bootstrap/src/bsci_init.c:156)"
    unknown = [
        f"{where}: unrecognized launcher: {name}",
        "[mpiexec@vm] main (mpiexec.c:75): unable to initialize the bootstrap server",
    ]
    said = _hosts.unreachable_host(unknown)
    assert said is not None and said.startswith(f"this mpiexec has no launcher {name} (")
    ll = [
        "[mpiexec@vm] HYDTI_bscd_ll_query_node_count (ll_query_node_list.c:61): No LL nodefile"
        " found",
        "[mpiexec@vm] HYD_pmci_launch_procs (pmiserv_pmci.c:121): launcher cannot launch processes",
    ]
    assert _hosts.unreachable_host(ll) == (
        "mpiexec's launcher could not start the ranks (No LL nodefile found); check "
        "--launcher, and run inside that scheduler's job if it needs one"
    )


def test_a_lost_ssh_line_still_names_the_host_that_does_not_resolve(tmp_path: Path) -> None:
    # hydra may end ssh before it prints: only "Launch proxy failed" reaches us
    proxy = ["[mpiexec@vm] ui_cmd_cb (pmiserv_pmci.c:51): Launch proxy failed."]
    hosts = tmp_path / "hosts"
    # hydra's extra fields (host:slots:..., key=value) are not part of the host's name
    hosts.write_text("# two hosts\nlocalhost:1:1\n\nnosuchhost.invalid:2 ifhn=eth0  # bad\n")
    line = _hosts.unreachable_host(proxy, str(hosts))
    assert line is not None and line.startswith("mpiexec cannot reach host nosuchhost.invalid (")
    # every name resolves, or there is no file to read: the generic line, not a guess
    hosts.write_text("localhost:2\n")
    for hostfile in (str(hosts), str(tmp_path / "gone"), None):
        assert "could not start its proxy" in str(_hosts.unreachable_host(proxy, hostfile))


@given(
    launcher=st.sampled_from(["srun", "rsh", "ssh", "blaunch", "/opt/pbs/bin/pbs_tmrsh"]),
    host=st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    why=st.sampled_from(["No such file or directory", "Permission denied"]),
    slurm=st.booleans(),
)
# a host named like its launcher (CI found it): the line is parsed, not substituted
@example(launcher="rsh", host="rsh", why="No such file or directory", slurm=False)
def test_a_launcher_mpiexec_cannot_run_is_named(
    launcher: str, host: str, why: str, slurm: bool
) -> None:
    """hydra prints one execvp line for a launcher it cannot run, then waits for ever:
    that line must end the job and name the program (a proxy's line names the host)."""
    env = SLURM if slurm else {}
    where = "/mpich/src/pm/hydra/lib/utils/launch.c:73"
    line = (
        f"[mpiexec@{host}] HYDU_create_process ({where}): execvp error on file {launcher} ({why})"
    )
    assert _hosts.launcher_cannot_run(line)
    after = [line, f"[mpiexec@{host}] ui_cmd_cb (pmiserv_pmci.c:51): Launch proxy failed."]
    said = _hosts.unreachable_host(after, None, env)
    assert said is not None and said.startswith(
        f"mpiexec cannot run its launcher {launcher} ({why}); "
    )
    assert ("srun is not on PATH" in said) == (slurm and launcher == "srun")
    # the ranks' own program missing on a host: hydra ends the job itself; name the host
    proxy = (
        f"[proxy:0@{host}] HYDU_create_process ({where}): execvp error on file "
        f"/venv/bin/python ({why})"
    )
    assert not _hosts.launcher_cannot_run(proxy)
    said = _hosts.unreachable_host([proxy], None, env)
    assert said == (
        f"host {host} cannot run /venv/bin/python ({why}); every host needs the same Python "
        "environment at the same path (docs/cluster.md)"
    )
    assert not _hosts.launcher_cannot_run("iter 1 execvp error on file srun (x)")


@pytest.mark.parametrize(
    "command", ["run sgdmf", "cluster t.sqlite", "resume t.sqlite", "dual sgdmf", "chaos sgdmf"]
)
def test_every_launching_command_refuses_a_missing_hostfile(
    command: str, cli, tmp_path: Path
) -> None:
    res = cli(*command.split(), "--hostfile", str(tmp_path / "nope"), cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert (
        res.stderr == f"replay: error: --hostfile {tmp_path / 'nope'}: no such file; "
        "give a file with one host per line\n"
    )


def test_slurm_ranks_beyond_the_allocation_refused_before_a_start(cli, tmp_path: Path) -> None:
    res = cli("run", "sgdmf", "--ranks", "8", "--no-trace", env=SLURM, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--ranks 8 is more than the 4 task(s) of Slurm job 4242" in res.stderr


@pytest.mark.mpi
def test_a_replay_beyond_the_allocation_names_the_recorded_ranks(
    cli, trace_library, tmp_path: Path
) -> None:
    """A replay runs on the ranks its trace records: the user passed no --ranks, so the
    refusal must not tell them to use fewer."""
    trace = trace_library.copy(tmp_path, *SGDMF_2)
    res = cli("cluster", str(trace), env={**SLURM, "SLURM_NTASKS": "1"}, cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr == (
        "replay: error: the run was recorded on 2 ranks, more than the 1 task(s) of Slurm "
        "job 4242, and replays and resumes run on the recorded ranks: ask for 2 with "
        "'salloc -n 2' (or 'sbatch -n 2')\n"
    )


@pytest.mark.mpi
def test_the_options_reach_mpiexec(tmp_path: Path) -> None:
    """A logging wrapper records the command line of each launch, then runs it."""
    log = tmp_path / "argv.log"
    wrapper = tmp_path / "mpiexec-logged"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {mpiexec()} "$@"\n')
    wrapper.chmod(0o755)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    env = {"REPLAY_MPIEXEC": str(wrapper), "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}
    trace = tmp_path / "t.sqlite"
    params = ["-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "epochs=1"]
    # inside the "allocation": --ranks defaults to its 2 tasks and hydra gets -launcher slurm,
    # which cannot start here (no srun on PATH): hydra would wait for ever after saying so
    began = time.monotonic()
    proc = run_cli(
        ["run", "sgdmf", *params, "--trace", str(trace), "--timeout", "60"],
        env={**env, "PATH": str(tmp_path)},
    )
    assert time.monotonic() - began < 30, "the job was waited for, not ended"
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "replay: error: mpiexec cannot run its launcher srun (No such file or directory); "
        "SLURM_JOB_ID is set but srun is not on PATH"
    ), proc.stderr
    assert not trace.exists()
    assert log.read_text().split("\n")[0].split()[:4] == ["-launcher", "slurm", "-n", "2"]
    log.unlink()
    place = ["--hostfile", str(hosts), "--launcher", "fork"]
    env = {"REPLAY_MPIEXEC": str(wrapper)}
    trace = tmp_path / "t2.sqlite"
    argv = ["run", "sgdmf", *params, "--ranks", "2", "--trace", str(trace), *place]
    proc = run_cli(argv, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(["cluster", str(trace), "--json", "--timeout", "60", *place], env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["identical"], proc.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.split()[:6] == ["-f", str(hosts), "-launcher", "fork", "-n", "2"]
    assert lines[0].endswith(f"{sys.executable} -m replay._worker")


@pytest.mark.mpi
def test_an_unreachable_host_is_one_line_and_leaves_traces_intact(cli, tmp_path: Path) -> None:
    """The commands run in this process (their ranks are mpiexec's, and so is the host that
    cannot be reached); the test above launches a real console script."""
    bad = tmp_path / "hosts"
    bad.write_text("localhost:1\nnosuchhost.invalid:1\n")
    trace = tmp_path / "t.sqlite"
    params = ["-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "epochs=1"]
    began = time.monotonic()
    argv = ["run", "sgdmf", *params, "--ranks", "2", "--trace", str(trace), "--timeout", "60"]
    proc = cli(*argv, "--hostfile", str(bad))
    assert time.monotonic() - began < 60
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("replay: error: mpiexec cannot reach host nosuchhost.invalid"), last
    assert not trace.exists()  # nothing ran: no empty trace is left behind
    # a trace that holds a run stays whole when its replay cannot reach a host
    assert cli(*argv).returncode == 0
    proc = cli("cluster", str(trace), "--hostfile", str(bad), "--timeout", "60")
    assert proc.returncode == 2 and "cannot reach host nosuchhost.invalid" in proc.stderr
    proc = cli("verify", str(trace))
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), proc.stderr
    proc = cli("cluster", str(trace), "--json", "--timeout", "60")
    assert proc.returncode == 0 and json.loads(proc.stdout)["identical"], proc.stderr


HYDRA_DEATH = [
    "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES",
    "=   PID 4242 RUNNING AT node07",
    "=   EXIT CODE: 9",
    "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)",
]


def test_a_dead_rank_is_named_from_its_hello_report() -> None:
    """hydra names a dead process by pid and host only; each rank's hello report says
    which rank that is.  No report, or two that fit equally, leaves it unnamed."""
    from replay._job import _death_message, _rank_of

    hellos = [(0, {"pid": 4242, "host": "node03"}), (1, {"pid": 4242, "host": "node07"})]
    who = _rank_of(HYDRA_DEATH, hellos)
    assert who == "rank 1 (pid 4242 on node07)"
    msg = _death_message(2, 9, HYDRA_DEATH, 2.04, who)
    assert msg.startswith("rank 1 (pid 4242 on node07) of the 2-rank job died after 2.0 s")
    assert "(Killed (signal 9))" in msg
    # one report with that pid (hosts may name themselves otherwise than hydra does)
    assert _rank_of(HYDRA_DEATH, [(1, {"pid": 4242, "host": "n7.local"})]) is not None
    for unclear in ([], [(0, {"pid": 1, "host": "node07"})], [(0, "junk"), (1, None)]):
        assert _rank_of(HYDRA_DEATH, unclear) is None
        assert _death_message(2, 9, HYDRA_DEATH, 1.0, None).startswith("a rank of the")
    two = [(0, {"pid": 4242, "host": "a"}), (1, {"pid": 4242, "host": "b"})]
    assert _rank_of(HYDRA_DEATH, two) is None  # same pid on two other hosts: unknown
