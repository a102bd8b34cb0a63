"""The review inbox in the browser, served by ``capgate serve --http`` at ``/inbox``.

:class:`capgate.adapters.fronts.inbox.app.Inbox` is the application (it needs the
``mcp`` extra's Starlette and Jinja2, so it is imported from there, not here);
:mod:`.sessions` keeps who is signed in and limits failed sign-ins; :mod:`.settings`
is the configuration's ``inbox:`` section. Its rules of review are the review desk's.
"""
