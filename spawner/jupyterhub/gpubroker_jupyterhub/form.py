"""The options form: gpubroker's profiles as radio buttons, and the
reading of what comes back (from the form or from REST ``user_options``).

The form only offers; the broker decides. Whatever profile name arrives is
sent to the broker, which refuses a profile that does not exist or is not
offered to the user's groups, in words shown on the hub's page.
"""

from __future__ import annotations

import html
from typing import Any, Dict, List, Mapping, Optional

# FIELD is the form field and the user_options key naming the profile.
FIELD = "profile"


class OptionsError(ValueError):
    """user_options that cannot name a profile; the text says why."""


def describe_slice(profile: Mapping[str, Any]) -> str:
    """One line about a profile's offer, in the user's units, for example
    ``8 GiB GPU memory · 10 % of the GPU's compute (bursts to 50 %) · 1 CPU · 4Gi memory``.

    Reads the broker/api/v1 Profile fields slice.memoryMiB,
    slice.computePercent, slice.computeLimitPercent, cpu and memory; missing
    fields are left out.
    """
    parts: List[str] = []
    sl = profile.get("slice") or {}
    mib = sl.get("memoryMiB")
    if isinstance(mib, int) and mib > 0:
        parts.append("%s GPU memory" % _mib(mib))
    pct, limit = sl.get("computePercent"), sl.get("computeLimitPercent")
    if isinstance(pct, int) and pct > 0:
        if pct >= 100:
            parts.append("the whole GPU's compute")
        elif isinstance(limit, int) and limit > pct:
            parts.append("%d %% of the GPU's compute (bursts to %d %%)" % (pct, limit))
        else:
            parts.append("%d %% of the GPU's compute" % pct)
    cpu = profile.get("cpu")
    if cpu:
        parts.append("%s CPU" % cpu)
    mem = profile.get("memory")
    if mem:
        parts.append("%s memory" % mem)
    return " · ".join(parts)


def _mib(mib: int) -> str:
    if mib % 1024 == 0:
        return "%d GiB" % (mib // 1024)
    return "%d MiB" % mib


def render(profiles: List[Mapping[str, Any]], selected: str = "") -> str:
    """The form's HTML (the hub adds the <form> and the submit button).

    profiles are broker/api/v1 Profile dicts in the broker's order;
    selected names the one checked at first (the first profile when it is
    "" or not among them). With no profiles the form says so and has no
    input, so a submit reaches the broker without a profile and the broker's
    refusal explains. Every text is HTML-escaped.
    """
    if not profiles:
        return (
            '<div class="gpubroker-profiles"><p class="text-danger">'
            "gpubroker offers no profile to your groups. Ask an administrator for access."
            "</p></div>"
        )
    names = [str(p.get("name", "")) for p in profiles]
    if selected not in names:
        selected = names[0]
    rows = []
    for p, name in zip(profiles, names):
        ident = "gpubroker-profile-%d" % len(rows)
        title = str(p.get("displayName") or name)
        lines = [describe_slice(p)]
        if p.get("description"):
            lines.append(str(p["description"]))
        rows.append(
            '<div class="radio"><label for="{id}">'
            '<input type="radio" name="{field}" id="{id}" value="{value}"{checked}> '
            "<strong>{title}</strong>{details}</label></div>".format(
                id=ident,
                field=FIELD,
                value=html.escape(name, quote=True),
                checked=" checked" if name == selected else "",
                title=html.escape(title),
                details="".join("<br><small>%s</small>" % html.escape(line) for line in lines if line),
            )
        )
    return (
        '<div class="gpubroker-profiles form-group">'
        "<p>Choose a GPU profile:</p>%s</div>" % "".join(rows)
    )


def from_form(formdata: Mapping[str, List[str]]) -> Dict[str, str]:
    """user_options from the form's data (a dict of lists of strings):
    ``{"profile": name}``, or {} when none was chosen."""
    values = formdata.get(FIELD) or []
    name = values[0].strip() if values else ""
    return {FIELD: name} if name else {}


def requested_profile(user_options: Optional[Mapping[str, Any]]) -> str:
    """The profile named in user_options, "" when none.

    Accepts ``{"profile": "small"}`` (REST, or our form) and
    ``{"profile": ["small"]}`` (a form's raw data passed through). Other
    keys are ignored: a caller of the hub's REST API may send anything.
    Raises OptionsError when "profile" is present but is not one name.
    """
    if not user_options:
        return ""
    value = user_options.get(FIELD, "")
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise OptionsError(
            "user_options %r must name one profile as a string, not %s" % (FIELD, type(value).__name__)
        )
    return value.strip()
