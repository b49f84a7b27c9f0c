"""The exec journal (the tool's EXEC_JOURNAL_PROGRAM) run as a sandbox runs it: `python -S` on its own,
in front of an episode. The runtime kills the exec'd process when the exec's stream ends (kwok and
containerd do: ASSUMPTIONS.md "Exec"), so a start may be killed at any line; these tests kill it where
an API outage found it on the real control plane, between its journal and its episode."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import find_python

MARK = "rl-batch-demo exec journal: "


class Journal:
    """One claim's journal in tmp_path, its episode a shell command that counts its runs."""

    def __init__(self, program, folder, name="claim-0", python=sys.executable):
        self.program, self.path, self.runs = program, folder / "exec" / name, folder / ("runs-" + name)
        self.python = python
        self.started = []  # the starts run in the background

    def argv(self, mode, *command):
        return [self.python, "-S", "-B", str(self.program), mode, str(self.path), *command]

    def episode(self, body="exit 0"):
        return ["sh", "-c", "echo ran >> '%s'; %s" % (self.runs, body)]

    def start(self, body="exit 0"):
        return subprocess.run(self.argv("start", *self.episode(body)), capture_output=True, text=True, timeout=120)

    def start_in_background(self, body="exit 0"):
        start = subprocess.Popen(self.argv("start", *self.episode(body)), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.started.append(start)
        return start

    def kill_what_is_left(self):
        """Every process of every start still in the background (a stopped one, its keeper and
        episode), whatever a failed test left."""
        for start in self.started:
            if start.poll() is None:  # not reaped, so its group is still this start's
                os.killpg(start.pid, signal.SIGKILL)
                start.wait(timeout=120)

    def follow(self):
        return subprocess.run(self.argv("follow"), capture_output=True, text=True, timeout=120)

    def run_count(self):
        return len(self.runs.read_text().splitlines()) if self.runs.exists() else 0


def said(done):
    """The journal's own word (never-started, started-before, lost), or None: the episode's answer."""
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return last[len(MARK):] if done.returncode == 125 and last.startswith(MARK) else None


def state(pid):
    """The process's state letter in /proc (T: stopped), or "" once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def others_in_group(pid):
    """The processes other than `pid` in its process group (a start's forks: the keeper, the child
    between them, the episode), read from /proc/*/stat (its command line may read empty mid-fork)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            try:
                with open("/proc/%s/stat" % entry) as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[2]) == pid:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def stopped_before_its_episode(make_journal, attempts=200):
    """(journal, start process) with the start stopped (SIGSTOP) after its journal appeared and before
    it forked the process that runs the episode: the moment a runtime's kill can find it in."""
    for attempt in range(attempts):
        journal = make_journal("claim-%d" % attempt)
        start = journal.start_in_background()
        while not journal.path.is_dir() and start.poll() is None:
            pass  # as fast as this process can look: the moment lasts a fork
        if start.poll() is not None:  # it ran to its end first
            start.communicate(timeout=120)
            continue
        os.kill(start.pid, signal.SIGSTOP)
        while start.poll() is None and state(start.pid) not in "Tt":
            pass  # a signal is delivered when the process next runs: it may fork first
        if start.poll() is None and not (journal.path / "began").exists() and not others_in_group(start.pid):
            return journal, start
        if start.poll() is None:  # stopped, so it stays until it is let go
            os.kill(start.pid, signal.SIGCONT)
        start.communicate(timeout=120)
    pytest.fail("no start was stopped between its journal and its fork in %d tries" % attempts)


@pytest.fixture
def make_journal(tool, tmp_path):
    program = tmp_path / tool.EXEC_JOURNAL_FILE
    program.write_text(tool.EXEC_JOURNAL_PROGRAM)
    made = []

    def make(name="claim-0", python=sys.executable):
        made.append(Journal(program, tmp_path, name, python))
        return made[-1]
    yield make
    for journal in made:
        journal.kill_what_is_left()


def test_a_start_streams_its_episode_and_a_follow_reads_the_same_output_and_code_again(make_journal):
    journal = make_journal()
    started = journal.start("echo out; echo err >&2; exit 3")
    followed = journal.follow()
    assert (started.returncode, started.stdout, started.stderr) == (3, "out\n", "err\n")
    assert (followed.returncode, followed.stdout, followed.stderr) == (3, "out\n", "err\n")
    assert journal.run_count() == 1


def test_the_exec_journal_runs_on_python_3_9(make_journal):
    journal = make_journal(python=find_python("3.9"))
    started, again, followed = journal.start("echo out; exit 4"), journal.start(), journal.follow()
    assert (started.returncode, started.stdout, said(again), followed.returncode, followed.stdout) == (
        4, "out\n", "started-before", 4, "out\n")
    assert journal.run_count() == 1


def test_a_second_start_says_started_before_and_runs_nothing(make_journal):
    journal = make_journal()
    assert journal.start().returncode == 0
    again = journal.start()
    assert said(again) == "started-before"
    assert journal.run_count() == 1


def test_starts_sent_at_once_run_the_episode_once(make_journal):
    journal = make_journal()
    starts = [journal.start_in_background() for _ in range(8)]
    answers = [(start.wait(timeout=120), start.stderr.read()) for start in starts]
    assert sorted(code for code, _ in answers) == [0] + [125] * 7, answers
    assert journal.run_count() == 1


def test_a_follow_of_a_journal_never_made_says_never_started(make_journal):
    assert said(make_journal().follow()) == "never-started"


def test_a_start_killed_before_its_episode_began_is_never_started_and_starts_again(make_journal):
    # Seen on the real control plane: the API server killed as an exec began; kwok killed the exec'd
    # start between its journal and its episode, and the episode was reported lost, never run.
    journal, start = stopped_before_its_episode(make_journal)
    os.kill(start.pid, signal.SIGKILL)
    start.wait(timeout=120)
    assert said(journal.follow()) == "never-started"
    assert journal.start().returncode == 0
    assert journal.run_count() == 1


def test_a_follow_waits_for_a_start_that_lives_though_its_episode_has_not_begun(make_journal):
    journal, start = stopped_before_its_episode(make_journal)
    follow = subprocess.Popen(journal.argv("follow"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # a follow that wrongly took the start for dead has answered by now; a right one waits
    os.kill(start.pid, signal.SIGCONT)
    stdout, stderr = follow.communicate(timeout=120)
    assert (follow.returncode, stderr) == (0, "")
    assert start.wait(timeout=120) == 0
    assert journal.run_count() == 1


def test_an_episode_lost_with_its_sandbox_is_lost_and_never_run_again(make_journal):
    journal = make_journal()
    start = journal.start_in_background("exec sleep 600")
    while journal.run_count() == 0:
        assert start.poll() is None, start.communicate()
        time.sleep(0.02)
    os.killpg(start.pid, signal.SIGKILL)  # the container restarted: every process of the exec is gone
    start.wait(timeout=120)
    assert said(journal.follow()) == "lost"
    assert said(journal.start()) == "started-before"
    assert journal.run_count() == 1


def test_the_journal_reads_in_the_source_as_it_runs_in_the_sandbox(tool):
    # filled in by name, not with %: a `%` in the source is the program's own (no `%%` to misread)
    from conftest import SCRIPT
    source = SCRIPT.read_text()
    start = source.index("EXEC_JOURNAL_PROGRAM = ")
    text = source[start:source.index("\n'''", start)]
    assert "%%" not in text
    shipped = tool.EXEC_JOURNAL_PROGRAM
    assert "@MARK@" not in shipped and "@EXIT@" not in shipped
    assert "MARK, EXIT = %r, %d" % (tool.EXEC_JOURNAL_MARK, tool.EXEC_JOURNAL_EXIT) in shipped
    compile(shipped, "exec-journal.py", "exec")
