"""No prompt is ever code: which `cmd:` templates may carry a prompt.

A `cmd:` template's placeholders ({prompt}, {instructions}, {workspace}) carry text that is
not the operator's: a night replays logged traffic, so {prompt} holds an end user's words.
The template is split into argv once and never run by a shell, but the program it names may
be one: `sh -c`, `python -c`, `env sh -c`, `ssh host CMD` all read an argument as code. So a
template is accepted only when every placeholder is data:

- a placeholder is a whole argument (`{prompt}`) or a flag's value (`--ask={prompt}`), never
  part of a larger one (`"Q: {prompt}"`, `-e{prompt}`); without {prompt} the prompt is stdin;
- a POSIX shell or an interpreter we can parse (python, perl, node) takes one only after its
  script (a file, or a `-c` / `-e` script that holds no placeholder), where it reads no more
  options: `sh -c 'my-agent "$1"' sh {prompt}`, `python agent.py {prompt}`; it must have a
  script (without one it reads its program from stdin, where the prompt may be);
- a launcher (`env`, `timeout`, `nice`, `sudo`, `ssh`, `xargs`, ...) runs another program with
  arguments we do not parse, so no placeholder may follow it; with the prompt on stdin, what
  it launches is checked as above; one that may start a shell of its own is refused;
- any other interpreter, or a shell we cannot parse (fish, csh, pwsh, awk, sed, sqlite3, ...),
  is refused whatever the template: a script of yours with a shebang, named directly, is the
  way to run one.

No list of programs is complete: a night that replays traffic on a `cmd:` agent also needs the
operator's opt-in (`NightConfig.allow_cmd_replay`, docs/security.md)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from selftaught.errors import InputError

PLACEHOLDER = re.compile(r"\{(prompt|instructions|workspace)\}")
_WHOLE = re.compile(r"\{(?:prompt|instructions|workspace)\}")
_FLAG_VALUE = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]*=\{(?:prompt|instructions|workspace)\}")

SAFE_FORMS = (
    "safe forms: cmd:my-agent --ask {prompt} (a whole argument), cmd:my-agent --ask={prompt}, "
    "cmd:my-agent (the prompt on stdin), cmd:./my-agent.sh {prompt} (your script, named "
    "directly), cmd:sh -c 'my-agent --ask \"$1\"' sh {prompt} (an argument after the script)"
)


class CommandTemplateError(InputError):
    """A cmd: template that cannot be run safely or at all."""


def holds(arg: str) -> bool:
    return PLACEHOLDER.search(arg) is not None


def program_name(path: str) -> str:
    """What a program is, from its path: `/usr/bin/python3.11` → python, `sh.distrib` → sh,
    `ksh93` → ksh, `bash-static` → bash."""
    name = os.path.basename(path).lower().removesuffix(".exe")
    name = re.sub(r"-(static|dbg|real|bin)$", "", name.split(".")[0])
    return re.sub(r"(?<=[a-z])[\d_-]+$", "", name) or name


# ---- what programs are --------------------------------------------------------------------


@dataclass(frozen=True)
class Grammar:
    """How a shell or interpreter reads its arguments, as far as the check needs: which
    options take a value, which value is code, where its own options end. An option not
    listed here is refused: without knowing it, the check cannot tell where the script is."""

    what: str  # "shell" or the language, for messages
    flags: str = ""  # letters taking no value
    values: str = ""  # letters taking a value, attached or the next argument
    optional: str = ""  # letters whose value, if any, is attached (perl -l, -0)
    code: str = ""  # letters whose value is code (python -c, perl -e)
    stdin: str = ""  # letters that read code from stdin (sh -s, python -i)
    items: dict[str, str] = field(default_factory=dict)  # whole options → flag/value/code/stdin
    clusters: bool = True  # letters combine (-Sc, -euo)
    attached: bool = True  # a value may be attached (-Wignore); shells: -o NAME only
    plus: bool = False  # +o NAME, +e: shells
    eq_any: bool = False  # any --name=value is one self-contained option (node)
    script_flag: str = ""  # with this flag the first operand is the script (sh -c)
    code_ends_options: bool = False  # python: after -c CODE / -m MOD the rest is argv
    data_after_code: bool = True  # after -e CODE, operands are data (perl, node; not lua)


_POSIX_SHELL = Grammar(
    "shell",
    flags="abBCcefhHiklmnpPrtuvxE",
    values="oO",
    stdin="s",
    items={
        **dict.fromkeys(
            ("--login", "--noprofile", "--norc", "--posix", "--restricted", "--verbose"), "flag"
        ),
        **dict.fromkeys(("--noediting", "--debugger"), "flag"),
        **dict.fromkeys(("--rcfile", "--init-file"), "value"),
    },
    attached=False,
    plus=True,
    script_flag="c",
)
_PYTHON = Grammar(
    "Python",
    flags="bBdEhIOPqRsSuvVx",
    values="WX",
    code="cm",
    stdin="i",
    items={"--version": "flag", "--help": "flag", "--check-hash-based-pycs": "value"},
    code_ends_options=True,
)
_PERL = Grammar(
    "Perl",
    flags="cswWXtTuUvS",  # not -n / -p / -a / -F / -i: they open operands with magic open
    values="IMm",
    optional="l0",
    code="eE",
)
_NODE = Grammar(
    "JavaScript",
    items={
        **dict.fromkeys(("-e", "--eval", "-p", "-pe", "--print"), "code"),
        **dict.fromkeys(("-r", "--require", "--import", "--input-type", "--title"), "value"),
        **dict.fromkeys(("-i", "--interactive"), "stdin"),
        **dict.fromkeys(("-c", "--check", "--no-warnings", "--enable-source-maps"), "flag"),
        **dict.fromkeys(("--trace-warnings", "--no-deprecation", "--preserve-symlinks"), "flag"),
    },
    clusters=False,
    eq_any=True,
)
_SCRIPT_ONLY = {  # a script file, or inline code whose operands are not simply data
    "ruby": Grammar("Ruby", code="e", data_after_code=False),
    "php": Grammar("PHP", code="rBRE", data_after_code=False),
    "lua": Grammar("Lua", code="e", data_after_code=False),
    "luajit": Grammar("Lua", code="e", data_after_code=False),
}


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


POSIX_SHELLS = _names("sh bash rbash dash ash zsh ksh mksh pdksh oksh lksh loksh yash posh hush")
GRAMMARS: dict[str, Grammar] = {
    **dict.fromkeys(POSIX_SHELLS, _POSIX_SHELL),
    **dict.fromkeys(("python", "pypy"), _PYTHON),
    "perl": _PERL,
    **dict.fromkeys(("node", "nodejs"), _NODE),
    **_SCRIPT_ONLY,
}
# Shells and interpreters whose arguments we do not parse: refused in any template.
OPAQUE = _names(
    """fish csh tcsh rc es elvish nu nushell xonsh ion oil osh ysh murex pwsh powershell cmd
    scsh tclsh wish expect awk gawk mawk nawk sed m4 dc bc sqlite psql mysql osascript r
    rscript julia erl escript elixir iex scala groovy guile racket sbcl clisp ecl ghc ghci
    runghc runhaskell gdb lldb vim vi nvim ex view emacs make gmake deno bun tsx ipython
    raku octave jshell eval source"""
)
# Launchers run the program that follows them. These may also start a shell of their own
# (no command given, -s / -i, a remote or joined command line): refused even on stdin.
SHELL_LAUNCHERS = _names(
    """ssh rsh mosh su sudo doas runuser pkexec script watch flock chroot unshare nsenter
    schroot proot firejail machinectl docker podman kubectl lxc toolbox distrobox screen tmux
    xargs parallel sg newgrp login unbuffer nix-shell nix npx uvx uv poetry pipenv conda pixi
    bundle"""
)
LAUNCHERS = SHELL_LAUNCHERS | _names(
    """env timeout nice ionice taskset stdbuf setsid nohup time chrt prlimit numactl cgexec
    systemd-run strace ltrace valgrind catchsegv eatmydata faketime fakeroot torsocks
    proxychains proxychains4 tsocks nocache chpst softlimit setpriv setarch linux
    cpulimit trickle rlwrap tini dumb-init gosu su-exec chronic flatpak-spawn xvfb-run
    dbus-run-session bwrap find command builtin exec"""
)
MULTICALL = frozenset({"busybox", "toybox"})  # the program is their first argument


# ---- the check ----------------------------------------------------------------------------


def check_template(argv: list[str]) -> None:
    """CommandTemplateError when the template could run a placeholder's text, or the prompt
    on stdin, as code (the module's rules)."""
    _check_program(argv)
    for arg in argv:
        if holds(arg) and not (_WHOLE.fullmatch(arg) or _FLAG_VALUE.fullmatch(arg)):
            _refuse(
                f"`{arg}` puts a placeholder inside a larger argument, which a program may "
                "read as code or options; a placeholder must be a whole argument ({prompt}) "
                "or a flag's value (--ask={prompt})"
            )


def _refuse(why: str) -> None:
    raise CommandTemplateError(f"cmd: {why}; {SAFE_FORMS}")


def _check_program(argv: list[str]) -> None:
    if holds(argv[0]):
        _refuse(f"`{argv[0]}` as the program would let the prompt choose what runs")
    name = program_name(argv[0])
    if name in MULTICALL:
        if len(argv) > 1:
            _check_program(argv[1:])
    elif name in LAUNCHERS:
        _check_launcher(argv, name)
    elif name in GRAMMARS:
        _Reader(argv, GRAMMARS[name]).check()
    elif name in OPAQUE:
        _refuse(
            f"`{argv[0]}` reads code from its arguments or stdin in ways selftaught cannot "
            "check, so it may run the prompt; name a script of yours directly instead"
        )


def _check_launcher(argv: list[str], name: str) -> None:
    if any(holds(a) for a in argv):
        _refuse(
            f"`{argv[0]}` launches another program with arguments selftaught cannot check "
            "(a shell's -c script, a joined command line), so no placeholder may follow it; "
            f"put `{argv[0]}` in a script of yours, or leave {{prompt}} out so the prompt "
            "goes to stdin"
        )
    if name in SHELL_LAUNCHERS:
        _refuse(
            f"`{argv[0]}` may start a shell (or join its arguments into one command line), "
            "which would read the prompt on stdin as code; put it in a script of yours"
        )
    for i, arg in enumerate(argv[1:], start=1):
        words = arg.split()
        if len(words) > 1 and any(_known(w) for w in words):
            _refuse(f"`{arg}` hides a command line inside one argument of `{argv[0]}`")
        if _known(arg):  # each program it may launch is checked as if it came first
            _check_program(argv[i:])


def _known(word: str) -> bool:
    name = program_name(word)
    return name in GRAMMARS or name in OPAQUE or name in LAUNCHERS or name in MULTICALL


@dataclass
class _Reader:
    """Reads a shell's or interpreter's argv as it would, up to where its own options end."""

    argv: list[str]
    g: Grammar
    i: int = 1
    inline: bool = False  # code came from an option (python -c, perl -e)
    script_flag: bool = False  # sh -c: the first operand is the script

    def check(self) -> None:
        """Refuses a placeholder anywhere before the data, and a program read from stdin."""
        ended = self._options()
        if ended is None:  # options ended at the first operand, self.i (maybe after `--`)
            self._operand()

    def _options(self) -> int | None:
        """Walk the options; where data starts when they end it (python -c CODE, perl -e CODE
        then `--` or a first operand), else None with self.i at the first operand."""
        argv, g, prog = self.argv, self.g, self.argv[0]
        while self.i < len(argv):
            arg = argv[self.i]
            if arg == "--":
                self.i += 1
                return self.i if (self.inline and g.data_after_code) else None
            if arg == "-":
                self._stdin(arg)
            if arg.startswith("-") or (g.plus and arg.startswith("+")):
                if self._option(arg):
                    return self.i
                continue
            if holds(arg) and self.inline:
                hint = "put `--` before it" if g.data_after_code else "use a script file"
                _refuse(
                    f"`{arg}` is where `{prog}` still reads options: a prompt starting with '-' "
                    f"would be one (such as -e CODE); {hint}"
                )
            return self.i if (self.inline and g.data_after_code and not holds(arg)) else None
        return None

    def _option(self, arg: str) -> bool:
        """Step past one option (and its value); True when it ended the options."""
        g = self.g
        name, eq, _ = arg.partition("=")
        kind = g.items.get(name if arg.startswith("--") else arg)
        if holds(arg):
            _refuse(f"`{arg}` gives the prompt to an option of `{self.argv[0]}` itself")
        if kind is None and arg.startswith("--") and g.eq_any and eq:
            kind = "flag"  # --name=value: one argument, whatever the option
        if kind is not None:
            return self._take(arg, kind, attached=bool(eq) or kind == "flag")
        if not g.clusters or arg.startswith("--"):
            self._unknown(arg)
        return self._cluster(arg)

    def _cluster(self, arg: str) -> bool:
        """-abc: each letter an option; a letter taking a value takes the rest, or the next
        argument."""
        g, j = self.g, 1
        while j < len(arg):
            letter, rest = arg[j], arg[j + 1 :]
            if letter in g.stdin:
                self._stdin(arg)
            if letter == g.script_flag:
                self.script_flag = True
            if letter in g.flags:
                j += 1
            elif letter in g.optional:  # perl -l / -0: an octal value, then more letters
                j += 1 + len(rest) - len(rest.lstrip("01234567"))
            elif letter in g.values or letter in g.code:
                if rest and not g.attached:
                    self._unknown(arg)
                return self._take(arg, "code" if letter in g.code else "value", attached=bool(rest))
            else:
                self._unknown(arg)
        self.i += 1
        return False

    def _take(self, arg: str, kind: str, *, attached: bool) -> bool:
        """Step past an option and its value (the next argument unless attached)."""
        if kind == "stdin":
            self._stdin(arg)
        value_at = self.i + 1
        self.i += 1 if attached or kind == "flag" else 2
        if kind in ("value", "code") and not attached:
            if value_at >= len(self.argv):
                _refuse(f"`{arg}` of `{self.argv[0]}` needs a value")
            value = self.argv[value_at]
            if holds(value) and kind == "code":
                what = f"would run the prompt as {self.g.what} code"
                _refuse(f"`{self.argv[0]} {arg} {value}` {what}")
            if holds(value):
                what = f"gives the prompt to an option of `{self.argv[0]}` itself"
                _refuse(f"`{arg} {value}` {what}")
        if kind == "code":
            self.inline = True
            return self.g.code_ends_options
        return False

    def _operand(self) -> None:
        """The first operand: the script (sh -c's, or a file); what follows it is data. After
        inline code whose operands are not plain data (ruby, lua), no placeholder at all."""
        argv, at, prog = self.argv, self.i, self.argv[0]
        if self.inline:
            later = [a for a in argv[at:] if holds(a)]
            if later:
                _refuse(
                    f"`{prog}` may read `{later[0]}` as code, an option or a file to run; "
                    "pass the prompt to a script file of yours instead"
                )
            return
        if at >= len(argv):
            self._stdin(None)
        if holds(argv[at]) and self.script_flag:
            _refuse(
                f"a placeholder inside the script of `{' '.join(argv[:at])}` would run the "
                "prompt as shell code; pass it as an argument after the script"
            )
        if holds(argv[at]):
            _refuse(
                f"`{argv[at]}` is where `{prog}` reads its script or options: the prompt would "
                "choose the code to run; pass it after the script"
            )

    def _stdin(self, arg: str | None) -> None:
        what = f"`{self.argv[0]} {arg}`" if arg else f"`{self.argv[0]}` with no script"
        _refuse(f"{what} reads its program from stdin, which may hold the prompt; give it one")

    def _unknown(self, arg: str) -> None:
        _refuse(
            f"`{arg}` is an option of `{self.argv[0]}` that selftaught does not know, so it "
            "cannot tell where the script ends and the data begins"
        )
