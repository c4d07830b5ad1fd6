from django import template

from serving.services.deployments import deployable_name

register = template.Library()


@register.inclusion_tag("dashboard/_job_deploy.html", takes_context=True)
def deploy_button(context, job) -> dict:
    """The job page's Deploy button, shown once the job left an adapter to serve."""
    return {"job": job, "name": deployable_name(job), "csrf_token": context.get("csrf_token")}
