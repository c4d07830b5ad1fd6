"""Which workspace a signed-in member is looking at: the one chosen in the session, if they are
still a member of it, else their first. Views get it as `request.workspace`."""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from veri.errors import NotFound
from veri.models import Membership, Workspace

SESSION_KEY = "veri_workspace"


def memberships(user) -> list[Membership]:
    return list(Membership.objects.filter(user=user).select_related("workspace").order_by("pk"))


def choose(request, workspace_id: str) -> bool:
    """Switch to a workspace the user is a member of; False (nothing changes) otherwise."""
    if Membership.objects.filter(user=request.user, workspace__public_id=workspace_id).exists():
        request.session[SESSION_KEY] = workspace_id
        return True
    return False


def current(request) -> Workspace | None:
    mine = memberships(request.user)
    chosen = request.session.get(SESSION_KEY)
    for membership in mine:
        if membership.workspace.public_id == chosen:
            return membership.workspace
    return mine[0].workspace if mine else None


def workspace_view(view):
    """A signed-in page of one workspace: `request.workspace` set, the switcher's choices in
    `request.memberships`; a user in no workspace sees how to get one."""

    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        request.memberships = memberships(request.user)
        request.workspace = current(request)
        if request.workspace is None:
            return render(request, "dashboard/no_workspace.html", status=403)
        return view(request, *args, **kwargs)

    return wrapped


def or_404(read, **kwargs):
    """What a workspace-scoped selector reads, or the page's 404 (another workspace's object
    included)."""
    try:
        return read(**kwargs)
    except NotFound:
        raise Http404 from None


def int_param(request, name: str, default: int) -> int:
    try:
        return int(request.GET.get(name, default))
    except ValueError:
        return default
