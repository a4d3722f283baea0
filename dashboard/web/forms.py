"""Input forms both doors validate with: the alerts page posts them, the API sends the same fields as JSON."""

from __future__ import annotations

from django import forms

from dashboard.web.input_bounds import INT_MAX

MAX_SILENCE_HOURS = 24 * 30


class SilenceForm(forms.Form):
    """A matcher (run, kind, rank; blank = any), a duration and a mandatory comment."""

    run = forms.CharField(required=False, max_length=200)
    kind = forms.CharField(required=False, max_length=64)
    rank = forms.IntegerField(required=False, min_value=0, max_value=INT_MAX)  # the column's range
    hours = forms.FloatField(min_value=0.01, max_value=MAX_SILENCE_HOURS, initial=2)
    comment = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    project = forms.CharField(required=False, max_length=100)
