# sandboxd's code interpreter: E2B's extra result formats.
#   e2b/chart  a matplotlib Figure as data (type, title, labels, elements),
#              what E2B's SDKs read as Result.chart
#   e2b/data   a pandas DataFrame as {column: [values]}, Result.data
def _sandboxd_formats():
    import json

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    def _num(v):
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        return f if f == f and f not in (float("inf"), float("-inf")) else None

    def _unit(label):
        import re

        m = re.search(r"\s\((.*?)\)|\[(.*?)\]", label or "")
        return (m.group(1) or m.group(2)) if m else None

    def _axes2d(ax, chart):
        xl, yl = ax.get_xlabel() or None, ax.get_ylabel() or None
        chart.update(x_label=xl, y_label=yl, x_unit=_unit(xl), y_unit=_unit(yl))
        return chart

    def _ticks(ax, chart):
        chart.update(
            x_ticks=[_num(t) for t in ax.get_xticks()],
            x_tick_labels=[t.get_text() for t in ax.get_xticklabels()],
            x_scale=ax.get_xscale(),
            y_ticks=[_num(t) for t in ax.get_yticks()],
            y_tick_labels=[t.get_text() for t in ax.get_yticklabels()],
            y_scale=ax.get_yscale(),
        )
        return chart

    def _axes(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.patches import Rectangle, Wedge

        title = ax.get_title() or None
        lines = ax.get_lines()
        colls = [c for c in ax.collections if isinstance(c, PathCollection)]
        patches = list(ax.patches)
        if patches and all(isinstance(p, Wedge) for p in patches) and not lines:
            return {"type": "pie", "title": title, "elements": [
                {"label": w.get_label(), "angle": abs(round(w.theta2 - w.theta1, 4)), "radius": w.r} for w in patches]}
        if ax.containers and patches and all(isinstance(p, Rectangle) for p in patches):
            labels = [t.get_text() for t in ax.get_xticklabels()]
            elements = []
            for group in ax.containers:
                name = group.get_label() or ""
                if name.startswith("_"):  # matplotlib's name for an unlabelled group
                    name = ""
                for i, rect in enumerate(group):
                    label = labels[i] if i < len(labels) and labels[i] else str(i)
                    elements.append({"label": label, "group": name, "value": _num(rect.get_height())})
            return _axes2d(ax, {"type": "bar", "title": title, "elements": elements})
        if lines and not colls and not patches:
            kind, elements = "line", [
                {"label": l.get_label(), "points": [[_num(x), _num(y)] for x, y in zip(l.get_xdata(), l.get_ydata())]}
                for l in lines]
        elif colls and not lines and not patches:
            kind, elements = "scatter", [
                {"label": c.get_label(), "points": [[_num(x), _num(y)] for x, y in c.get_offsets()]} for c in colls]
        else:
            return {"type": "unknown", "title": title, "elements": []}
        return _ticks(ax, _axes2d(ax, {"type": kind, "title": title, "elements": elements}))

    def chart(fig):
        axes = fig.get_axes()
        if not axes:
            return None
        if len(axes) > 1:
            sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
            return {"type": "superchart", "title": sup, "elements": [_axes(a) for a in axes]}
        return _axes(axes[0])

    def data(df):
        return {str(c): json.loads(df[c].to_json(orient="values", date_format="iso")) for c in df.columns}

    def of(module, name, fn):
        # By class name, not by the formatter's type registries: those
        # come back empty in a kernel, and importing the types here would
        # load matplotlib and pandas into every kernel at start.
        def call(self, obj):
            t = type(obj)
            if not self.enabled or t.__name__ != name or not t.__module__.startswith(module):
                return None
            try:
                return fn(obj)
            except Exception:
                return None

        return call

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        __call__ = of("matplotlib", "Figure", chart)

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        __call__ = of("pandas", "DataFrame", data)

    ip = get_ipython()
    if ip is None:
        return
    f = ip.display_formatter
    cf, df = ChartFormatter(parent=f), DataFormatter(parent=f)
    f.formatters["e2b/chart"] = cf
    f.formatters["e2b/data"] = df
    # Only the active types are computed, and the list was taken at start.
    f.active_types = list(f.active_types) + ["e2b/chart", "e2b/data"]


_sandboxd_formats()
del _sandboxd_formats
