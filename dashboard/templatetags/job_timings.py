"""`{% startup_bar job as bar %}`: the job's start-up phases as segments of one bar
(templates/dashboard/_timings.html)."""

from django import template

from training.services import timings

register = template.Library()

LABELS = {
    "queued": "Queued",
    "launched": "Launched",
    "registered": "Worker registered",
    "volumes_synced": "Volumes synced",
    "model_loaded": "Model loaded",
    "first_step": "First step",
    "first_checkpoint": "First checkpoint",
}
# One colour per phase reached (SVG fill attributes: the CSP allows no inline styles).
COLOURS = ("#8c959f", "#0969da", "#8250df", "#bf8700", "#1a7f37", "#cf222e")


@register.simple_tag
def startup_bar(job) -> dict:
    """Each phase reached after queued, with the seconds it took from the one before and its
    place on a 0-100 bar; `synced` the bytes and rate of the volumes' sync, when reported."""
    steps = timings.steps(job)[1:]
    total = sum(step["seconds"] for step in steps)
    segments, x = [], 0.0
    for number, step in enumerate(steps):
        width = 100 * step["seconds"] / total if total else 100 / len(steps)
        segments.append(
            {
                "phase": step["phase"],
                "label": LABELS[step["phase"]],
                "seconds": step["seconds"],
                "at": step["at"],
                "x": f"{x:.3f}",
                "width": f"{max(width, 0.2):.3f}",
                "colour": COLOURS[number % len(COLOURS)],
            }
        )
        x += width
    shown = timings.of(job)
    return {
        "segments": segments,
        "reached": segments[-1]["label"] if segments else "",
        "total": total,
        "synced_bytes": shown["synced_bytes"],
        "sync_rate": shown["sync_bytes_per_second"],
    }
