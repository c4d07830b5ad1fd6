"""Dashboard pages of volumes (files, usage over time, delete with the name) and datasets."""

import json

from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dashboard.forms import ConfirmNameForm
from dashboard.workspaces import or_404, workspace_view
from training import selectors as training_selectors
from training.services import datasets as dataset_services
from veri.errors import VeriError
from volumes import selectors, services

PAGE = 50


def _volume(request, volume_id: str):
    return or_404(selectors.get_volume, workspace=request.workspace, id_or_name=volume_id)


@workspace_view
def volume_list(request):
    volumes = selectors.list_volumes(workspace=request.workspace).order_by("name")
    return render(request, "dashboard/volumes.html", {"volumes": volumes})


def _volume_page(request, volume, form: ConfirmNameForm, status: int = 200):
    files = Paginator(selectors.list_files(volume=volume).order_by("path"), PAGE)
    usage = selectors.list_usage(volume=volume).order_by("-hour")[: 24 * 30]
    series = [
        {"hour": int(u.hour.timestamp()), "bytes": u.total_bytes, "files": u.file_count}
        for u in reversed(usage)
    ]
    context = {
        "volume": volume,
        "files": files.get_page(request.GET.get("page")),
        "usage_json": json.dumps(series),
        "form": form,
    }
    return render(request, "dashboard/volume.html", context, status=status)


@workspace_view
def volume_detail(request, volume_id: str):
    return _volume_page(request, _volume(request, volume_id), ConfirmNameForm())


@require_POST
@workspace_view
def volume_delete(request, volume_id: str):
    volume = _volume(request, volume_id)
    form = ConfirmNameForm(request.POST)
    try:
        services.delete_volume(volume=volume, confirm=request.POST.get("confirm", ""))
    except VeriError:
        form.add_error("confirm", f"That is not {volume.name!r}: nothing was deleted.")
        return _volume_page(request, volume, form, status=400)
    messages.success(request, f"Deleted volume {volume.name}; its files go within a minute.")
    return redirect("dashboard:volumes")


@workspace_view
def dataset_list(request):
    datasets = training_selectors.list_datasets(workspace=request.workspace).order_by("-pk")
    return render(
        request,
        "dashboard/datasets.html",
        {"page": Paginator(datasets, PAGE).get_page(request.GET.get("page"))},
    )


def _dataset(request, dataset_id: str):
    return or_404(
        training_selectors.get_dataset, workspace=request.workspace, dataset_id=dataset_id
    )


@workspace_view
def dataset_detail(request, dataset_id: str):
    dataset = _dataset(request, dataset_id)
    try:
        rows, unavailable = dataset_services.preview_dataset(dataset=dataset), ""
    except VeriError as exc:
        rows, unavailable = [], exc.message
    context = {
        "dataset": dataset,
        "rows": [json.dumps(row, ensure_ascii=False, indent=2) for row in rows],
        "unavailable": unavailable,
    }
    return render(request, "dashboard/dataset.html", context)


@require_POST
@workspace_view
def dataset_delete(request, dataset_id: str):
    dataset = _dataset(request, dataset_id)
    try:
        dataset_services.delete_dataset(dataset=dataset)
    except VeriError as exc:
        messages.error(request, exc.message)
        return redirect("dashboard:dataset", dataset_id=dataset.public_id)
    messages.success(request, f"Deleted dataset {dataset.name or dataset.public_id}.")
    return redirect("dashboard:datasets")
