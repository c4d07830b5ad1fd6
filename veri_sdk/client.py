from veri_sdk.billing import Billing
from veri_sdk.catalog import Gpus, Regions
from veri_sdk.config import resolve
from veri_sdk.deployments import Deployments
from veri_sdk.evaluations import Evaluations
from veri_sdk.http import ApiTransport, StorageTransport
from veri_sdk.secrets import Secrets
from veri_sdk.tinker import Tinker
from veri_sdk.training import Datasets, TrainingJobs
from veri_sdk.volumes import Volumes
from veri_sdk.webhooks import Webhooks


class Client:
    """`Client()` reads `VERI_API_KEY` / `VERI_API_URL`, else what `veri login` saved."""

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 4,
    ):
        key, url = resolve(api_key, base_url)
        self.base_url = url
        self.api = ApiTransport(base_url=url, api_key=key, timeout=timeout, max_retries=max_retries)
        storage = StorageTransport(timeout=max(timeout, 300.0), max_retries=max_retries)
        self.volumes = Volumes(self.api, storage)
        self.datasets = Datasets(self.api)
        self.training_jobs = TrainingJobs(self.api, storage)
        self.billing = Billing(self.api)
        self.regions = Regions(self.api)
        self.gpus = Gpus(self.api)
        self.secrets = Secrets(self.api)
        self.tinker = Tinker(self.api)
        self.webhooks = Webhooks(self.api)
        self.deployments = Deployments(self.api)
        self.evaluations = Evaluations(self.api, self.datasets)
