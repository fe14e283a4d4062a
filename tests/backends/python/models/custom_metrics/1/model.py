"""Custom metrics (pb_utils.MetricFamily / Metric) and response parameters.

Each request: the counter grows by X, the gauge is set to X, the histogram observes X; VALUES is
[counter.value(), gauge.value()] and the response carries parameters. The request parameter
"action" changes that: "errors" (ERRORS holds the texts of refused metric operations),
"drop_gauge" (the gauge family is deleted), "gauge" (it is created again)."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.counter_family = pb_utils.MetricFamily(
            name="oceanus_test_requests",
            description="Requests seen by the test model",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.counter = self.counter_family.Metric(labels=labels)
        self.histogram_family = pb_utils.MetricFamily(
            name="oceanus_test_sizes",
            description="Sizes observed",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        self.histogram = self.histogram_family.Metric(labels=labels, buckets=[1.0, 5.0, 10.0])
        self.labels = labels
        self._gauge()

    def _gauge(self):
        self.gauge_family = pb_utils.MetricFamily(
            name="oceanus_test_last",
            description='The last "X"\nseen',
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.gauge = self.gauge_family.Metric(labels={**self.labels, "kind": "last"})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            action = json.loads(request.parameters()).get("action", "")
            errors = []
            if action == "errors":
                errors = self._errors()
            elif action == "drop_gauge":
                del self.gauge
                del self.gauge_family
            elif action == "gauge":
                self._gauge()
            else:
                self.counter.increment(x)
                self.gauge.set(x)
                self.gauge.increment(0.5)
                self.gauge.increment(-0.5)
                self.histogram.observe(x)
            gauge = self.gauge.value() if hasattr(self, "gauge") else -1.0
            values = np.array([self.counter.value(), gauge], dtype=np.float64)
            parameters = {"counter": int(self.counter.value()), "seen": True, "unit": "requests"}
            if action == "errors":
                parameters = json.dumps({"mode": "errors"})  # the JSON string form
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("VALUES", values),
                        pb_utils.Tensor("ERRORS", np.array(errors, dtype=np.object_)),
                    ],
                    parameters=parameters,
                )
            )
        return responses

    def _errors(self):
        texts = []
        attempts = [
            lambda: self.counter.increment(-1),
            lambda: self.counter.set(1),
            lambda: self.gauge.observe(1),
            lambda: self.histogram.value(),
            lambda: self.histogram.increment(1),
            lambda: self.counter_family.Metric(labels={"a": "b"}, buckets=[1.0]),
            lambda: self.histogram_family.Metric(labels={"a": "b"}),
            lambda: self.counter_family.Metric(labels="a=b"),
            lambda: pb_utils.MetricFamily("bad name!", "d", pb_utils.MetricFamily.COUNTER),
            lambda: pb_utils.MetricFamily(
                "oceanus_test_requests", "d", pb_utils.MetricFamily.GAUGE
            ),
            self._orphan,
        ]
        for attempt in attempts:
            try:
                attempt()
                texts.append("no error")
            except pb_utils.TritonModelException as exc:
                texts.append(exc.message())
        return texts

    def _orphan(self):
        family = pb_utils.MetricFamily("oceanus_test_orphan", "d", pb_utils.MetricFamily.COUNTER)
        metric = family.Metric(labels={"a": "b"})
        del family
        metric.increment(1)
