"""mutmut hook, copied into the snapshot by tools/mutation/run.py.

Mutants that only change the text of an error message are not run (mutmut records them as skipped, and
the page counts them apart): a message text changes no number, no shape and no control flow. Two kinds:
- lines that only build a message (a ``raise`` line, a string continuation, a comment), never a dict entry
  that opens with its string key (``"gamma": 0.995,``: a default, a diagnostic, a buffer);
- a string passed to a guard of ``reference_impl/_checks.py`` (a clause id such as ``"SAC-CRITIC-1"``,
  an argument's name), which the guard uses only to word the message it raises; a clause id anywhere
  else is message text too.
The guard's condition and every other argument are still mutated.
"""
import re

_CLAUSE_ID = re.compile(r'^"[A-Z]+(?:-[A-Z0-9]+)+"$')
# a line that opens with a string literal followed by a colon is a dict entry (a default, a diagnostic, a
# buffer): its value is code, and its key is read by name
_DICT_ENTRY = re.compile(r"""^[rRbBfF]{0,2}("[^"]*"|'[^']*')\s*:""")


def _is_message_line(line: str) -> bool:
    s = line.strip()
    if _DICT_ENTRY.match(s):
        return False
    return s.startswith(("raise ", "f\"", "\"", "f'", "'", "rf\"", "r\"")) or s.startswith("#")


def _mutated_line(context) -> str:
    from mutmut import Context, mutate

    ctx = Context(source=context.source, mutation_id=context.mutation_id, filename=context.filename,
                  dict_synonyms=[])
    mutated, _ = mutate(ctx)
    return mutated.splitlines()[context.current_line_index]


def _only_rewords_a_message(original: str, mutated: str) -> bool:
    """mutmut's string mutation wraps a literal in XX...XX: skip it for a guard's string arguments and
    for clause ids."""
    guard = original.strip().startswith("_checks.")
    for literal in re.findall(r'"[^"]*"', original):
        wrapped = '"XX' + literal[1:-1] + 'XX"'
        if (guard or _CLAUSE_ID.match(literal)) and original.replace(literal, wrapped, 1) == mutated:
            return True
    return False


def pre_mutation(context):
    line = context.current_source_line
    if _is_message_line(line):
        context.skip = True
    elif '"' in line and _only_rewords_a_message(line, _mutated_line(context)):
        context.skip = True
