"""Ops and regions grouped into candidates and measured: shapes and their stability, bytes and FLOPs from shapes, roofline ceilings, each candidate's numbers."""
