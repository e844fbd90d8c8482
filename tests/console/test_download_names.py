"""A console download is served only under the random name its click was given, briefly: never
under Streamlit's content-hash name, which is the same for the same export (so a URL seen once,
in a proxy log or on a shared screen, would fetch the next export while it is served).

On Streamlit's real in-memory file store, as the console patches it."""

from __future__ import annotations

import pytest
from streamlit.runtime.media_file_storage import MediaFileKind, MediaFileStorageError
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

from kmq_dagster.console import downloads
from kmq_dagster.console.downloads import DownloadAliases
from tests.kafka_helpers import wait_for

EXPORT = b"topic,partition,offset\norders,0,7\n"


@pytest.fixture
def storage(monkeypatch: pytest.MonkeyPatch) -> MemoryMediaFileStorage:
    monkeypatch.setattr(downloads, "SERVED_FOR_S", 0.2)
    store = MemoryMediaFileStorage("/media")
    aliases = DownloadAliases(store)
    store.get_url = aliases.get_url  # type: ignore[method-assign]
    store.get_file = aliases.get_file  # type: ignore[method-assign]
    return store


def file_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def add_export(store: MemoryMediaFileStorage) -> str:
    return store.load_and_get_id(
        EXPORT, "text/csv", MediaFileKind.DOWNLOADABLE, filename="dead-letters.csv"
    )


def test_the_content_hash_name_serves_nothing(storage: MemoryMediaFileStorage) -> None:
    file_id = add_export(storage)
    url = storage.get_url(file_id)

    assert file_id not in url
    with pytest.raises(MediaFileStorageError):
        storage.get_file(f"{file_id}.csv")
    assert storage.get_file(file_name(url)).content == EXPORT


def test_the_same_export_twice_gets_two_names(storage: MemoryMediaFileStorage) -> None:
    first, second = storage.get_url(add_export(storage)), storage.get_url(add_export(storage))
    assert first != second
    assert len(file_name(first).split(".")[0]) == 32  # 128 random bits


def test_a_name_ends_shortly_after_its_first_request(storage: MemoryMediaFileStorage) -> None:
    url = storage.get_url(add_export(storage))
    storage.get_file(file_name(url))
    storage.get_file(file_name(url))  # Chromium may ask twice for one download

    def gone() -> bool:
        try:
            storage.get_file(file_name(url))
        except MediaFileStorageError:
            return True
        return False

    assert wait_for(gone, timeout_s=30)


def test_images_are_served_as_streamlit_serves_them(storage: MemoryMediaFileStorage) -> None:
    file_id = storage.load_and_get_id(b"\x89PNG", "image/png", MediaFileKind.MEDIA)
    url = storage.get_url(file_id)
    assert file_id in url
    assert storage.get_file(f"{file_id}.png").content == b"\x89PNG"
