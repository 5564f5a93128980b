"""Pure renderers: DAG → Ray Serve config; DAG + overrides → KubeRay RayService."""

from servegraph.render.rayservice import PodOverrides, RayServiceOptions, rayservice_name, render_rayservice
from servegraph.render.serve_config import render_serve_config, serve_config_yaml
from servegraph.render.workers import WorkerGroupPlan, plan_worker_groups

__all__ = [
    "PodOverrides",
    "RayServiceOptions",
    "WorkerGroupPlan",
    "plan_worker_groups",
    "rayservice_name",
    "render_rayservice",
    "render_serve_config",
    "serve_config_yaml",
]
