"""Pure renderers: DAG → Ray Serve config; DAG + overrides → KubeRay RayService."""

from servegraph.render.rayservice import PodOverrides, RayServiceOptions, rayservice_name, render_rayservice
from servegraph.render.serve_config import render_serve_config, serve_config_yaml

__all__ = [
    "PodOverrides",
    "RayServiceOptions",
    "rayservice_name",
    "render_rayservice",
    "render_serve_config",
    "serve_config_yaml",
]
