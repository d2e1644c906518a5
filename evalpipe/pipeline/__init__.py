"""The run pipeline: a config becomes a plan (plan), the plan runs variant by variant
(runner), and the finished variants are compared and reported (comparing). It joins the
layers below it (execution, compare, report, history) and is driven by the commands.
"""
