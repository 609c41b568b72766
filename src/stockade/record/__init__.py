"""The record: events from every layer, and the kernel audit reader."""

from stockade.record._event import EVENT_VERSION, Event, Layer, Outcome

__all__ = ["EVENT_VERSION", "Event", "Layer", "Outcome"]
